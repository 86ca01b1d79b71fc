//! The commands that talk to a host's admin API: `deploy`, `list`,
//! `describe`, `logs`, `pause`, `resume`, `delete`, `query`.
//!
//! The server's error messages are shown verbatim (they name the forbidden
//! import, the foreign topic, the exceeded quota).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use onceflow::api::{
    Deleted, DeployRequest, DeploymentList, DeploymentSummary, ErrorBody, LogLines, QueryAnswer,
    Uploaded, UsageReport,
};
use onceflow::types::{Usage, error_chain};
use reqwest::StatusCode;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Exit, OutputFormat, load_manifest, read_component, usage};

/// Where the admin API is and who is calling.
#[derive(Debug, Clone, clap::Args)]
pub struct RemoteArgs {
    /// Admin API of any host (http://host:port, or https://host:port when
    /// the host serves HTTPS).
    #[arg(long, env = "ONCEFLOW_SERVER", default_value = "http://127.0.0.1:8750")]
    pub server: String,
    /// Trust the CA in this PEM file for an https:// server (besides the
    /// system's trusted roots): the CA that signed the host's --tls-cert.
    #[arg(long, env = "ONCEFLOW_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Your tenant token.
    #[arg(long, env = "ONCEFLOW_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Output format: tables for people, JSON for scripts.
    #[arg(long, value_enum, default_value = "text")]
    pub output: OutputFormat,
}

/// A client of one admin API.
pub struct Remote {
    client: Client,
    base: String,
    token: String,
    /// Output format.
    pub output: OutputFormat,
}

impl Remote {
    /// Checks the arguments and builds the client.
    pub fn new(args: &RemoteArgs) -> anyhow::Result<Self> {
        let token = args
            .token
            .clone()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| usage("no token: pass --token or set ONCEFLOW_TOKEN"))?;
        let base = args.server.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(usage(format!(
                "--server {base:?}: expected http://host:port"
            )));
        }
        let mut builder = Client::builder().timeout(Duration::from_secs(300));
        if let Some(ca) = &args.ca_cert {
            if !base.starts_with("https://") {
                return Err(usage(format!(
                    "--ca-cert is for an https:// server, and --server is {base:?}: use https://"
                )));
            }
            let pem = std::fs::read(ca)
                .map_err(|e| usage(format!("--ca-cert {}: cannot read it: {e}", ca.display())))?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                usage(format!(
                    "--ca-cert {}: not a PEM certificate ({e}): give the CA certificate \
                     that signed the host's --tls-cert",
                    ca.display()
                ))
            })?;
            if roots.is_empty() {
                return Err(usage(format!(
                    "--ca-cert {}: no CERTIFICATE block in it: give the CA certificate \
                     that signed the host's --tls-cert",
                    ca.display()
                )));
            }
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
        }
        let client = builder.build().context("creating the HTTP client")?;
        Ok(Self {
            client,
            base,
            token,
            output: args.output,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn send<T: DeserializeOwned>(&self, request: RequestBuilder) -> anyhow::Result<T> {
        let response = request.bearer_auth(&self.token).send().map_err(|e| {
            let hint = self.hint(&e);
            anyhow::Error::new(e)
                .context(format!("cannot reach the admin API at {}{hint}", self.base))
        })?;
        answer(response)
    }

    /// What to do about a failed connection, when the cause is a TLS
    /// mismatch.
    fn hint(&self, e: &reqwest::Error) -> &'static str {
        let chain = error_chain(e).to_lowercase();
        let https = self.base.starts_with("https://");
        if let Some(hint) = certificate_hint(&chain).filter(|_| https) {
            hint
        } else if https && (chain.contains("wrong version") || chain.contains("corrupt message")) {
            " (it does not speak TLS: is the host serving http? then use http://)"
        } else if !https && e.is_request() && !e.is_connect() {
            " (if the host serves HTTPS, use --server https://…)"
        } else {
            ""
        }
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(self.client.get(self.url(path)))
    }

    fn post<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(self.client.post(self.url(path)))
    }

    fn post_json<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<T> {
        self.send(self.client.post(self.url(path)).json(body))
    }
}

/// `onceflow replay <name>` of a fleet deployment: the candidate component
/// (if any) uploaded, then the replay asked of a host.
pub fn replay(
    name: &str,
    mut request: onceflow::api::ReplayRequest,
    candidate: Option<&std::path::Path>,
    args: &RemoteArgs,
) -> anyhow::Result<onceflow::api::ReplayAnswer> {
    let remote = Remote::new(args)?;
    if let Some(path) = candidate {
        let bytes = read_component(path, None)?;
        let uploaded: Uploaded = remote.send(
            remote
                .client
                .post(remote.url("/v1/artifacts"))
                .header(reqwest::header::CONTENT_TYPE, "application/wasm")
                .body(bytes),
        )?;
        request.candidate = Some(uploaded.artifact);
    }
    remote.post_json(
        &format!("/v1/deployments/{}/replay", encode(name)),
        &request,
    )
}

/// What to do about the server's certificate, from a failed connection's
/// error chain (lowercase): rustls names what it refused
/// (`CaUsedAsEndEntity`, `NotValidForName`, `UnknownIssuer`, ...).
fn certificate_hint(chain: &str) -> Option<&'static str> {
    if chain.contains("causedasendentity") {
        // The CA is trusted (or is the certificate itself): passing it
        // again cannot help.
        Some(
            " (the host's certificate is a CA certificate (CA:TRUE), which TLS clients refuse \
             as a server's: give the host's --tls-cert a leaf certificate (CA:FALSE) signed by \
             that CA, and clients the CA with --ca-cert; docs/operations.md has a recipe)",
        )
    } else if chain.contains("not valid for name") || chain.contains("notvalidforname") {
        Some(
            " (the host's certificate does not name the host in --server: use a name or \
             address its subjectAltName holds, or give the host a certificate that names this \
             one)",
        )
    } else if chain.contains("certificate") || chain.contains("unknownissuer") {
        Some(
            " (its certificate is not trusted: pass the CA that signed the host's --tls-cert \
             with --ca-cert or ONCEFLOW_CA_CERT)",
        )
    } else {
        None
    }
}

/// The typed body of a success, or an error with the server's message and
/// an exit code (1: refused, 2: bad request or not found, 3: unavailable).
fn answer<T: DeserializeOwned>(response: Response) -> anyhow::Result<T> {
    let status = response.status();
    let text = response.text().unwrap_or_default();
    if status.is_success() {
        return serde_json::from_str(&text).with_context(|| {
            format!("the admin API answered something this CLI cannot read (HTTP {status}): is it the same Onceflow version?")
        });
    }
    let message = serde_json::from_str::<ErrorBody>(&text)
        .map(|b| b.error)
        .unwrap_or(text);
    let code = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::UNPROCESSABLE_ENTITY => 1,
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::INTERNAL_SERVER_ERROR => 3,
        _ => 2,
    };
    Err(Exit {
        code,
        message: format!("{message} (HTTP {})", status.as_u16()),
    }
    .into())
}

fn encode(part: &str) -> String {
    // Path and query parts: percent-encode everything but unreserved bytes.
    let mut out = String::with_capacity(part.len());
    for b in part.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn print_json(v: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Prints rows as an aligned table.
fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// A number for a table cell, as JSON writes it (`12.0`, not `12`).
fn num(x: f64) -> String {
    serde_json::Number::from_f64(x).map_or_else(|| "-".to_owned(), |n| n.to_string())
}

/// `onceflow deploy`: uploads the component (with a progress bar), then
/// deploys the manifest.
pub fn deploy(
    manifest_path: &std::path::Path,
    component: Option<PathBuf>,
    args: &RemoteArgs,
) -> anyhow::Result<ExitCode> {
    if let Some(text) = sink_config(manifest_path) {
        return deploy_sink(manifest_path, &text, args);
    }
    let remote = Remote::new(args)?;
    let manifest = load_manifest(manifest_path)?;
    let manifest_text = std::fs::read_to_string(&manifest.path)
        .with_context(|| format!("cannot read {}", manifest.path.display()))?;
    // The schema files it names go with it (read before the upload, so a
    // missing one stops the deploy at once).
    let schemas = onceflow::schema::SchemaFiles::read(&manifest)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .0;
    let component_path = component.unwrap_or_else(|| manifest.component_path());
    let bytes = read_component(&component_path, Some(&manifest))?;
    // The host refuses these with 413; say so before sending megabytes.
    use onceflow::fleet::registry::{MAX_ARTIFACT_BYTES, MAX_MANIFEST_BYTES};
    if bytes.len() > MAX_ARTIFACT_BYTES {
        anyhow::bail!(
            "{} is {} bytes, over the host's limit of {MAX_ARTIFACT_BYTES} bytes per component: \
             build in release mode and strip debug information",
            component_path.display(),
            bytes.len()
        );
    }
    if manifest_text.len() > MAX_MANIFEST_BYTES {
        anyhow::bail!(
            "{} is {} bytes, over the host's limit of {MAX_MANIFEST_BYTES} bytes per manifest",
            manifest.path.display(),
            manifest_text.len()
        );
    }

    let progress = indicatif::ProgressBar::new(bytes.len() as u64);
    if remote.output == OutputFormat::Text {
        progress.set_style(
            indicatif::ProgressStyle::with_template(
                "uploading {msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        progress.set_message(component_path.display().to_string());
    } else {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let len = bytes.len() as u64;
    let reader = progress.wrap_read(std::io::Cursor::new(bytes));
    let uploaded: anyhow::Result<Uploaded> = remote.send(
        remote
            .client
            .post(remote.url("/v1/artifacts"))
            .header(reqwest::header::CONTENT_TYPE, "application/wasm")
            .body(reqwest::blocking::Body::sized(reader, len)),
    );
    progress.finish_and_clear();
    let artifact = uploaded?.artifact;
    let deployed: DeploymentSummary = super::progress::during(
        remote.output == OutputFormat::Json,
        format!(
            "deploying {}: the host checks the component (compiling it, if new to it) and admits it",
            manifest.name
        ),
        || {
            remote.send(
                remote
                    .client
                    .put(remote.url(&format!("/v1/deployments/{}", encode(&manifest.name))))
                    .json(&DeployRequest {
                        manifest: manifest_text,
                        artifact: artifact.clone(),
                        schemas,
                    }),
            )
        },
    )?;
    match remote.output {
        OutputFormat::Json => print_json(&deployed)?,
        OutputFormat::Text => println!(
            "deployed {}.{} version {} (component sha256 {}, {} bytes)",
            deployed.tenant,
            deployed.name,
            deployed.version,
            &artifact[..artifact.len().min(12)],
            len
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// The text of `path` if it is a sink's configuration (a TOML file with
/// `[[routes]]` and no `[build]`), not a processor's manifest.
fn sink_config(path: &std::path::Path) -> Option<String> {
    if !path.is_file() {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let table: toml::Table = text.parse().ok()?;
    (table.contains_key("routes") && !table.contains_key("build")).then_some(text)
}

/// `onceflow deploy <sink.toml>`: a sink on the fleet (docs/sink.md).
fn deploy_sink(path: &std::path::Path, text: &str, args: &RemoteArgs) -> anyhow::Result<ExitCode> {
    let remote = Remote::new(args)?;
    // Checked here first: a typo is named without a round trip.
    let config = onceflow::sink::SinkConfig::parse(text, path)
        .map_err(|e| super::usage(onceflow::types::error_chain(&e)))?;
    let deployed: DeploymentSummary = remote.send(
        remote
            .client
            .put(remote.url(&format!("/v1/sinks/{}", encode(&config.name))))
            .json(&onceflow::api::SinkDeployRequest {
                config: text.to_owned(),
            }),
    )?;
    match remote.output {
        OutputFormat::Json => print_json(&deployed)?,
        OutputFormat::Text => println!(
            "deployed sink {}.{} version {} (group {}.{})",
            deployed.tenant, deployed.name, deployed.version, deployed.tenant, deployed.name
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `onceflow list`.
pub fn list(args: &RemoteArgs) -> anyhow::Result<ExitCode> {
    let remote = Remote::new(args)?;
    let list: DeploymentList = remote.get("/v1/deployments")?;
    match remote.output {
        OutputFormat::Json => print_json(&list)?,
        OutputFormat::Text if list.deployments.is_empty() => {
            println!("no deployments (deploy one with `onceflow deploy <manifest>`)");
        }
        OutputFormat::Text => {
            let rows: Vec<Vec<String>> = list
                .deployments
                .iter()
                .map(|d| {
                    vec![
                        d.name.clone(),
                        d.version.to_string(),
                        d.status.clone(),
                        d.hosts.len().to_string(),
                        d.partitions.to_string(),
                        d.lag.to_string(),
                        num(d.records_per_s),
                    ]
                })
                .collect();
            table(
                &[
                    "name",
                    "version",
                    "status",
                    "hosts",
                    "partitions",
                    "lag",
                    "records/s",
                ],
                &rows,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `onceflow describe`.
pub fn describe(name: &str, args: &RemoteArgs) -> anyhow::Result<ExitCode> {
    let remote = Remote::new(args)?;
    let v: DeploymentSummary = remote.get(&format!("/v1/deployments/{}", encode(name)))?;
    if remote.output == OutputFormat::Json {
        print_json(&v)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("name:        {}.{}", v.tenant, v.name);
    println!(
        "version:     {} (running: {:?})",
        v.version, v.running_versions
    );
    println!("status:      {}", v.status);
    println!(
        "component:   sha256 {} ({} bytes)",
        v.artifact, v.artifact_size
    );
    println!("lag:         {} records", v.lag);
    println!(
        "throughput:  {} records/s, {} commits/s",
        num(v.records_per_s),
        num(v.commits_per_s)
    );
    println!();
    let rows: Vec<Vec<String>> = v
        .hosts
        .iter()
        .map(|h| {
            let (stale, h) = (h.stale, &h.status);
            let parts: Vec<String> = h.partitions.iter().map(i32::to_string).collect();
            vec![
                h.host.clone(),
                h.version.to_string(),
                if stale {
                    format!("{} (stale)", h.state)
                } else {
                    h.state.clone()
                },
                if parts.is_empty() {
                    "-".to_owned()
                } else {
                    parts.join(",")
                },
                h.lag.to_string(),
                num(h.records_per_s),
                num(h.commit_p99_ms),
                h.aborts.to_string(),
                h.dead_lettered.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "host",
            "version",
            "state",
            "partitions",
            "lag",
            "records/s",
            "commit p99 ms",
            "aborts",
            "dead letters",
        ],
        &rows,
    );
    let errors: Vec<String> = v
        .hosts
        .iter()
        .flat_map(|h| {
            let h = &h.status;
            h.last_errors
                .iter()
                .map(move |e| format!("{}: {e}", h.host))
        })
        .collect();
    if !errors.is_empty() {
        println!("\nlast errors:");
        for e in errors {
            println!("  {e}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `onceflow logs [--follow]`.
pub fn logs(name: &str, follow: bool, tail: i64, args: &RemoteArgs) -> anyhow::Result<ExitCode> {
    let remote = Remote::new(args)?;
    let path = format!("/v1/deployments/{}/logs", encode(name));
    let mut from: Option<i64> = None;
    loop {
        let query = match from {
            Some(f) => format!("{path}?from={f}&wait_ms={}", if follow { 5000 } else { 0 }),
            None => format!("{path}?tail={tail}"),
        };
        let v: LogLines = remote.get(&query)?;
        if from.is_none() && v.lines.is_empty() && remote.output == OutputFormat::Text {
            // Said on stderr: stdout stays the lines alone, for pipes.
            eprintln!(
                "{name} has logged nothing yet{}",
                if follow {
                    "; waiting for its lines (Ctrl-C to stop)"
                } else {
                    " (a processor logs with its SDK's log calls; --follow waits for lines)"
                }
            );
        }
        for l in &v.lines {
            match remote.output {
                OutputFormat::Json => println!("{}", serde_json::to_string(l)?),
                OutputFormat::Text => println!(
                    "{} {:<5} {} p{} {}",
                    l.ts_ms,
                    l.level.to_uppercase(),
                    l.host,
                    l.partition,
                    l.message
                ),
            }
        }
        if !follow {
            // Without --follow: everything up to the end, then stop.
            if v.lines.is_empty() || Some(v.next) == from {
                break;
            }
        }
        from = Some(v.next);
    }
    Ok(ExitCode::SUCCESS)
}

/// `onceflow pause` / `resume`.
pub fn set_running(name: &str, running: bool, args: &RemoteArgs) -> anyhow::Result<ExitCode> {
    let remote = Remote::new(args)?;
    let verb = if running { "resume" } else { "pause" };
    let v: DeploymentSummary = remote.post(&format!("/v1/deployments/{}/{verb}", encode(name)))?;
    match remote.output {
        OutputFormat::Json => print_json(&v)?,
        OutputFormat::Text => println!(
            "{} {}: hosts {} at their next commit boundary",
            if running { "resumed" } else { "paused" },
            name,
            if running { "start it" } else { "stop it" }
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `onceflow delete [--purge-state]`.
pub fn delete(name: &str, purge_state: bool, args: &RemoteArgs) -> anyhow::Result<ExitCode> {
    let remote = Remote::new(args)?;
    let v: Deleted = super::progress::during(
        // Only the purge waits (for every host to stop the deployment).
        remote.output == OutputFormat::Json || !purge_state,
        format!(
            "deleting {name}: every host stops it at a commit boundary, then its state is purged"
        ),
        || {
            remote.send(remote.client.delete(remote.url(&format!(
                "/v1/deployments/{}?purge_state={purge_state}",
                encode(name)
            ))))
        },
    )?;
    match remote.output {
        OutputFormat::Json => print_json(&v)?,
        OutputFormat::Text if v.state_purged => {
            println!("deleted {name}; its state (stores, changelogs, consumer group) is gone")
        }
        OutputFormat::Text => println!(
            "deleted {name}; its state and offsets are kept (deploy it again to carry on, or delete --purge-state)"
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `onceflow query`: the committed value of a key.
/// `--since`: a duration back from `now_ms` (`90s`, `30m`, `24h`, `7d`) or
/// ms since the epoch.
fn since_ms(since: &str, now_ms: i64) -> anyhow::Result<i64> {
    let bad = || {
        usage(format!(
            "--since {since:?}: give a duration back from now (90s, 30m, 24h, 7d) or a time in ms since the epoch"
        ))
    };
    let s = since.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return if ms >= 0 { Ok(ms) } else { Err(bad()) };
    }
    let unit_ms: i64 = match s.chars().last() {
        Some('s') => 1_000,
        Some('m') => 60_000,
        Some('h') => 3_600_000,
        Some('d') => 86_400_000,
        _ => return Err(bad()),
    };
    let n: i64 = s[..s.len() - 1].parse().map_err(|_| bad())?;
    if n < 0 {
        return Err(bad());
    }
    Ok(now_ms.saturating_sub(n.saturating_mul(unit_ms)).max(0))
}

/// `onceflow usage`.
pub fn show_usage(since: Option<&str>, args: &RemoteArgs) -> anyhow::Result<ExitCode> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let since = since.map(|s| since_ms(s, now_ms)).transpose()?.unwrap_or(0);
    let remote = Remote::new(args)?;
    let report: UsageReport = remote.get(&format!("/v1/usage?since_ms={since}"))?;
    match remote.output {
        OutputFormat::Json => print_json(&report)?,
        OutputFormat::Text if report.deployments.is_empty() => {
            println!("no usage recorded yet");
        }
        OutputFormat::Text => {
            let row = |tenant: &str, name: &str, u: &Usage| {
                vec![
                    tenant.to_owned(),
                    name.to_owned(),
                    u.records_in.to_string(),
                    u.bytes_in.to_string(),
                    u.records_out.to_string(),
                    u.bytes_out.to_string(),
                    u.state_bytes.to_string(),
                    u.dead_letters.to_string(),
                    u.fuel.to_string(),
                    u.log_lines.to_string(),
                ]
            };
            let mut rows: Vec<Vec<String>> = report
                .deployments
                .iter()
                .map(|d| row(&d.tenant, &d.deployment, &d.usage))
                .collect();
            rows.push(row("", "total", &report.total));
            table(
                &[
                    "tenant",
                    "deployment",
                    "records in",
                    "bytes in",
                    "records out",
                    "bytes out",
                    "state bytes",
                    "dead letters",
                    "fuel",
                    "log lines",
                ],
                &rows,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn query(
    name: &str,
    store: &str,
    key: Option<String>,
    q: super::args::QueryArgs,
    args: &RemoteArgs,
) -> anyhow::Result<ExitCode> {
    let remote = Remote::new(args)?;
    let mut params: Vec<(&str, String)> = Vec::new();
    if let Some(key) = key {
        params.push(("key", key));
    }
    let optional = [
        ("prefix", q.prefix),
        ("from", q.from),
        ("to", q.to),
        ("window_from_ms", q.window_from_ms.map(|t| t.to_string())),
        ("window_to_ms", q.window_to_ms.map(|t| t.to_string())),
        ("limit", q.limit.map(|n| n.to_string())),
        ("source", q.from_changelog.then(|| "changelog".to_owned())),
    ];
    params.extend(
        optional
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| (name, v))),
    );
    if params.is_empty() {
        anyhow::bail!(
            "give a key, or --prefix, or --from/--to (a key range), or a key with \
             --window-from-ms/--window-to-ms (a window store)"
        );
    }
    let query: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect();
    let v: QueryAnswer = remote.get(&format!(
        "/v1/deployments/{}/state/{}?{}",
        encode(name),
        encode(store),
        query.join("&")
    ))?;
    match remote.output {
        OutputFormat::Json => print_json(&v)?,
        OutputFormat::Text => {
            let text = |t: &Option<String>, b: &Option<String>| match (t, b) {
                (Some(t), _) => t.clone(),
                (None, Some(b64)) => format!("base64:{b64}"),
                (None, None) => "-".to_owned(),
            };
            for item in &v.values {
                println!("{}", text(&item.value, &item.value_base64));
            }
            for e in &v.entries {
                let key = text(&e.key, &e.key_base64);
                let value = text(&e.value, &e.value_base64);
                match e.window_start_ms {
                    Some(start) => println!("{key}\t{start}\t{value}"),
                    None => println!("{key}\t{value}"),
                }
            }
            if v.truncated {
                eprintln!(
                    "(more entries matched: raise --limit, up to 10000, or narrow the query)"
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves one HTTPS connection on 127.0.0.1 with `chain` and `key`,
    /// answering a request with `{}`; returns the port.
    fn serve_once(
        chain: Vec<rustls::pki_types::CertificateDer<'static>>,
        key: rustls::pki_types::PrivateKeyDer<'static>,
    ) -> (u16, std::thread::JoinHandle<()>) {
        use std::io::{Read, Write};
        let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let conn =
                rustls::ServerConnection::new(std::sync::Arc::new(config)).expect("connection");
            let mut tls = rustls::StreamOwned::new(conn, stream);
            // A client that refuses the certificate aborts the handshake:
            // the read fails, and that is the end.
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match tls.read(&mut buf) {
                    Ok(n) if n > 0 => request.extend_from_slice(&buf[..n]),
                    _ => return,
                }
            }
            let _ = tls.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                  content-length: 2\r\nconnection: close\r\n\r\n{}",
            );
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
        (port, server)
    }

    /// `GET /v1/deployments` from `https://127.0.0.1:port` trusting `ca`.
    fn get_with_ca(port: u16, ca: &std::path::Path) -> anyhow::Result<serde_json::Value> {
        let remote = Remote::new(&RemoteArgs {
            server: format!("https://127.0.0.1:{port}"),
            ca_cert: Some(ca.to_path_buf()),
            token: Some("t".to_owned()),
            output: OutputFormat::Text,
        })?;
        remote.get("/v1/deployments")
    }

    /// A server whose certificate is a CA certificate (what
    /// docs/operations.md's recipe used to make): the CLI, given that very
    /// certificate with --ca-cert, is refused (`CaUsedAsEndEntity`) and told
    /// to make a leaf, not to pass --ca-cert again.
    #[test]
    fn a_ca_certificate_as_the_servers_is_named_as_such() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params
            .self_signed(&key)
            .expect("self-signed CA certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = dir.path().join("admin.pem");
        std::fs::write(&ca, cert.pem()).expect("write");
        let (port, server) = serve_once(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        );
        let e = get_with_ca(port, &ca).expect_err("a CA certificate as the server's is refused");
        let shown = format!("{e:#}");
        server.join().expect("server thread");
        assert!(shown.contains("CaUsedAsEndEntity"), "{shown}");
        assert!(
            shown.contains("is a CA certificate") && shown.contains("leaf certificate"),
            "{shown}"
        );
        assert!(!shown.contains("not trusted"), "{shown}");
    }

    /// docs/operations.md's test-certificate recipe, run as written (the
    /// doc runner runs it too, but `openssl verify` accepts a CA
    /// certificate as a server's): the CLI, given its CA, connects to a
    /// server with its certificate and key.
    #[test]
    fn the_operations_docs_certificate_recipe_makes_a_certificate_the_cli_trusts() {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md");
        let doc = std::fs::read_to_string(doc_path).expect("read docs/operations.md");
        let recipe = doc
            .split("```")
            .find(|b| b.starts_with("sh\n") && b.contains("-out admin-ca.pem"))
            .expect("docs/operations.md: the sh block that makes admin-ca.pem");
        let dir = tempfile::tempdir().expect("temp dir");
        let out = std::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &recipe["sh\n".len()..]])
            .current_dir(dir.path())
            .output()
            .expect("run bash (and the openssl CLI)");
        assert!(
            out.status.success(),
            "the recipe failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let chain = CertificateDer::pem_file_iter(dir.path().join("admin.pem"))
            .expect("read admin.pem")
            .collect::<Result<Vec<_>, _>>()
            .expect("admin.pem is PEM");
        let key =
            PrivateKeyDer::from_pem_file(dir.path().join("admin-key.pem")).expect("admin-key.pem");
        let (port, server) = serve_once(chain, key);
        let answer = get_with_ca(port, &dir.path().join("admin-ca.pem"));
        server.join().expect("server thread");
        let answer = answer.unwrap_or_else(|e| panic!("the recipe's certificate: {e:#}"));
        assert_eq!(answer, serde_json::json!({}));
    }

    #[test]
    fn certificate_hints_name_what_is_wrong() {
        let ca_leaf = "invalid peer certificate: other(othererror(causedasendentity))";
        let name = "invalid peer certificate: certificate not valid for name \"host-7\"; \
                    certificate is only valid for ipaddress(127.0.0.1)";
        let issuer = "invalid peer certificate: unknownissuer";
        assert!(certificate_hint(ca_leaf).is_some_and(|h| h.contains("leaf")));
        assert!(certificate_hint(name).is_some_and(|h| h.contains("subjectAltName")));
        assert!(certificate_hint(issuer).is_some_and(|h| h.contains("--ca-cert")));
        assert_eq!(certificate_hint("connection refused"), None);
    }

    #[test]
    fn encodes_path_parts() {
        assert_eq!(encode("acct-1"), "acct-1");
        assert_eq!(encode("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn since_takes_durations_and_epoch_ms() {
        let now = 10 * 86_400_000;
        assert_eq!(since_ms("90s", now).unwrap(), now - 90_000);
        assert_eq!(since_ms("30m", now).unwrap(), now - 1_800_000);
        assert_eq!(since_ms("24h", now).unwrap(), now - 86_400_000);
        assert_eq!(since_ms("7d", now).unwrap(), now - 7 * 86_400_000);
        assert_eq!(since_ms("99d", now).unwrap(), 0);
        assert_eq!(since_ms("1764547200000", now).unwrap(), 1_764_547_200_000);
        for bad in ["", "h", "3w", "-5m", "yesterday"] {
            let e = since_ms(bad, now).unwrap_err().to_string();
            assert!(e.contains("--since"), "{bad}: {e}");
        }
    }
}
