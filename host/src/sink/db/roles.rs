//! Who runs what in the sink's database session.
//!
//! The connection's user is the **sink's role**: it owns Onceflow's tables
//! (progress, markers, dead letters) and nothing that reaches the server's
//! OS or files. A tenant's statements (its routes) run under the
//! **tenant's role**, switched to in the batch's transaction (`SET LOCAL
//! ROLE`) and back before Onceflow's tables are written, with the tenant's
//! schema first on the `search_path`. The tenant's role may use its own
//! tables only: not Onceflow's, not other tenants', not the server's files
//! or programs.
//!
//! `SET ROLE` is only as strong as what runs under it: a function or a
//! trigger of the tenant's own, run inside the sink's session, could
//! `RESET ROLE` back to the sink's role. So the tenant's role may not
//! create anything that runs code (no `CREATE` on any schema, no function
//! of its own), and a route's statement calls built-in functions only
//! (`sql_check.rs`). Each of these is checked when a sink connects
//! ([`check_sink_role`], [`check_tenant_role`]) and when a fleet host
//! starts ([`check_connections`]); a refusal says what to change.

use postgres::{Client, Transaction};

use super::super::SinkError;
use super::super::config::{Connections, SinkConfig};

/// Predefined roles that reach the server's OS, its files or every
/// session's statements: neither the sink's role nor a tenant's may be
/// a member.
const DANGEROUS_ROLES: &[&str] = &[
    "pg_execute_server_program",
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_read_all_data",
    "pg_write_all_data",
    "pg_read_all_stats",
    "pg_monitor",
    "pg_signal_backend",
];

/// Why a role may not be used.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// The connection's user is a superuser.
    #[error(
        "the connection's user {user:?} is a superuser: a tenant's statement could then run \
         programs and read files on the database server (COPY ... TO PROGRAM, pg_read_file) and \
         change any table. Connect as a role without SUPERUSER that owns Onceflow's schema, and \
         keep the superuser for setup (docs/sink.md, \"The operator's setup\")"
    )]
    Superuser {
        /// The role.
        user: String,
    },
    /// A role is a member of predefined roles that reach the OS, files or
    /// every session.
    #[error(
        "the role {role:?} is a member of {members}: it could reach the server's files, programs \
         or other sessions. Revoke them (REVOKE {members} FROM {role}; docs/sink.md, \"The \
         operator's setup\")"
    )]
    Dangerous {
        /// The role.
        role: String,
        /// The predefined roles, comma-separated.
        members: String,
    },
    /// The tenant's role does not exist.
    #[error(
        "the role {role:?} (tenant {tenant:?}'s statements run under it) does not exist: create \
         it with its schema (docs/sink.md, \"The operator's setup\"), or name the tenant's role \
         in the connection's `roles`"
    )]
    Missing {
        /// The tenant.
        tenant: String,
        /// The role.
        role: String,
    },
    /// The tenant's role may do more than its own tables.
    #[error(
        "the role {role:?} (tenant {tenant:?}'s statements run under it) {why}: a tenant's role \
         may use its own tables only (docs/sink.md, \"The operator's setup\")"
    )]
    Unsafe {
        /// The tenant.
        tenant: String,
        /// The role.
        role: String,
        /// What it may do, and what to revoke.
        why: String,
    },
    /// The sink's role cannot switch to the tenant's.
    #[error(
        "the connection's user {user:?} may not SET ROLE {role:?}: GRANT {role} TO {user} (docs/sink.md, \
         \"The operator's setup\")"
    )]
    NotMember {
        /// The connection's user.
        user: String,
        /// The tenant's role.
        role: String,
    },
    /// A check could not be made.
    #[error("checking the roles")]
    Query(#[source] postgres::Error),
}

impl From<RoleError> for SinkError {
    fn from(e: RoleError) -> SinkError {
        SinkError::Database {
            what: "the sink's database roles".to_owned(),
            source: Box::new(e),
        }
    }
}

/// A role's name quoted for SQL (any name, `"` doubled).
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn dangerous_members(client: &mut Client, role: &str) -> Result<Vec<String>, RoleError> {
    let rows = client
        .query(
            "SELECT d FROM unnest($2::text[]) AS d \
             WHERE EXISTS (SELECT 1 FROM pg_roles WHERE rolname = d) \
               AND pg_has_role($1, d, 'MEMBER')",
            &[&role, &DANGEROUS_ROLES],
        )
        .map_err(RoleError::Query)?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Checks the connection's user (the sink's role): not a superuser, not a
/// member of a predefined role that reaches the OS, files or every
/// session. Returns its name.
pub(crate) fn check_sink_role(client: &mut Client) -> Result<String, RoleError> {
    let row = client
        .query_one(
            "SELECT current_user::text, rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .map_err(RoleError::Query)?;
    let user: String = row.get(0);
    if row.get::<_, bool>(1) {
        return Err(RoleError::Superuser { user });
    }
    let members = dangerous_members(client, &user)?;
    if !members.is_empty() {
        return Err(RoleError::Dangerous {
            role: user,
            members: members.join(", "),
        });
    }
    Ok(user)
}

/// Checks the role `role` that tenant `tenant`'s statements run under:
/// it exists, the sink's role `user` may switch to it, it is no superuser
/// and no member of the sink's role or a dangerous predefined role, it may
/// create nothing that runs code, it may not use `tables` (Onceflow's) nor
/// untrusted languages.
pub(crate) fn check_tenant_role(
    client: &mut Client,
    tenant: &str,
    role: &str,
    user: &str,
    tables: &[String],
) -> Result<(), RoleError> {
    let unsafe_ = |why: String| RoleError::Unsafe {
        tenant: tenant.to_owned(),
        role: role.to_owned(),
        why,
    };
    let Some(row) = client
        .query_opt(
            "SELECT rolsuper, rolcreaterole, rolbypassrls FROM pg_roles WHERE rolname = $1",
            &[&role],
        )
        .map_err(RoleError::Query)?
    else {
        return Err(RoleError::Missing {
            tenant: tenant.to_owned(),
            role: role.to_owned(),
        });
    };
    if role == user {
        return Err(unsafe_(format!(
            "is the connection's user itself, which owns Onceflow's tables: create a role of \
             the tenant's (CREATE ROLE {} NOLOGIN) and GRANT it TO {user}",
            quote_ident(role)
        )));
    }
    for (i, what) in ["SUPERUSER", "CREATEROLE", "BYPASSRLS"].iter().enumerate() {
        if row.get::<_, bool>(i) {
            return Err(unsafe_(format!(
                "has {what}: ALTER ROLE {} NO{what}",
                quote_ident(role)
            )));
        }
    }
    let member_of_sink: bool = client
        .query_one("SELECT pg_has_role($1, $2, 'MEMBER')", &[&role, &user])
        .map_err(RoleError::Query)?
        .get(0);
    if member_of_sink {
        return Err(unsafe_(format!(
            "is a member of the sink's role {user:?}, which owns Onceflow's tables: REVOKE {} FROM {}",
            quote_ident(user),
            quote_ident(role)
        )));
    }
    let members = dangerous_members(client, role)?;
    if !members.is_empty() {
        return Err(RoleError::Dangerous {
            role: role.to_owned(),
            members: members.join(", "),
        });
    }
    let can_set: bool = client
        .query_one("SELECT pg_has_role($1, $2, 'MEMBER')", &[&user, &role])
        .map_err(RoleError::Query)?
        .get(0);
    if !can_set {
        return Err(RoleError::NotMember {
            user: user.to_owned(),
            role: role.to_owned(),
        });
    }
    // Code of the tenant's own, run in the sink's session, could RESET ROLE.
    let creates: Vec<String> = client
        .query(
            "SELECT nspname::text FROM pg_namespace \
             WHERE has_schema_privilege($1, oid, 'CREATE') AND nspname NOT LIKE 'pg_temp%' \
               AND nspname NOT LIKE 'pg_toast_temp%' ORDER BY 1",
            &[&role],
        )
        .map_err(RoleError::Query)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !creates.is_empty() {
        return Err(unsafe_(format!(
            "may CREATE in schema {}: a function, trigger or operator of its own would run inside \
             the sink's session, which could switch back to the sink's role. Let the operator \
             create the tenant's tables and grant the role their DML (REVOKE CREATE ON SCHEMA {} \
             FROM {}; for a schema the role owns, ALTER SCHEMA ... OWNER TO the operator)",
            creates.join(", "),
            creates
                .iter()
                .map(|s| quote_ident(s))
                .collect::<Vec<_>>()
                .join(", "),
            quote_ident(role)
        )));
    }
    let functions: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE pg_has_role($1, proowner, 'USAGE')",
            &[&role],
        )
        .map_err(RoleError::Query)?
        .get(0);
    if functions > 0 {
        return Err(unsafe_(format!(
            "owns {functions} function(s): they could run inside the sink's session; drop them \
             or give them to the operator (ALTER FUNCTION ... OWNER TO ...)"
        )));
    }
    let languages: Vec<String> = client
        .query(
            "SELECT lanname::text FROM pg_language \
             WHERE NOT lanpltrusted AND lanname <> 'internal' AND lanname <> 'c' \
               AND has_language_privilege($1, oid, 'USAGE')",
            &[&role],
        )
        .map_err(RoleError::Query)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !languages.is_empty() {
        return Err(unsafe_(format!(
            "may use the untrusted language(s) {}: REVOKE USAGE ON LANGUAGE ... FROM {}",
            languages.join(", "),
            quote_ident(role)
        )));
    }
    for table in tables {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[table])
            .map_err(RoleError::Query)?
            .get(0);
        if !exists {
            continue;
        }
        let may: bool = client
            .query_one(
                "SELECT has_table_privilege($1, $2, \
                 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')",
                &[&role, table],
            )
            .map_err(RoleError::Query)?
            .get(0);
        if may {
            return Err(unsafe_(format!(
                "may use Onceflow's table {table}: REVOKE ALL ON {table} FROM {}",
                quote_ident(role)
            )));
        }
    }
    Ok(())
}

/// At a fleet host's start: every connection offered to tenants is
/// checked (the sink's role, and each tenant's role). A connection that
/// cannot be reached is logged and checked again when a sink starts on it;
/// a role that may not be used refuses the start, with what to change.
pub fn check_connections(connections: &Connections) -> Result<(), SinkError> {
    for c in connections.all() {
        let config = c.as_config();
        let password = super::read_password(&config)?;
        let mut client = match super::open(&config, password.as_deref()) {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(
                    connection = %c.name,
                    "{}; the sinks that name it check it again when they start",
                    crate::types::error_chain(&e)
                );
                continue;
            }
        };
        let in_connection = |e: RoleError| SinkError::Database {
            what: format!(
                "--sink-connections: connection {:?} ({})",
                c.name, c.connection
            ),
            source: Box::new(e),
        };
        let user = check_sink_role(&mut client).map_err(in_connection)?;
        let tables = super::own_tables(&config.schema);
        for tenant in &c.tenants {
            let role = c.role_of(tenant);
            check_tenant_role(&mut client, tenant, &role, &user, &tables).map_err(in_connection)?;
        }
    }
    Ok(())
}

/// `SET LOCAL ROLE` to the tenant's role with its schema first on the
/// `search_path`, and back; empty when the routes run as the
/// connection's user.
pub(super) struct AsTenant {
    enter: String,
    leave: String,
}

impl AsTenant {
    pub(super) fn of(config: &SinkConfig) -> AsTenant {
        match &config.postgres.role {
            Some(role) => {
                let r = quote_ident(role);
                AsTenant {
                    enter: format!("SET LOCAL ROLE {r}; SET LOCAL search_path = {r}, public"),
                    leave: "SET LOCAL ROLE NONE; SET LOCAL search_path TO DEFAULT".to_owned(),
                }
            }
            None => AsTenant {
                enter: String::new(),
                leave: String::new(),
            },
        }
    }

    pub(super) fn enter(&self, t: &mut Transaction<'_>) -> Result<(), postgres::Error> {
        if self.enter.is_empty() {
            return Ok(());
        }
        t.batch_execute(&self.enter)
    }

    pub(super) fn leave(&self, t: &mut Transaction<'_>) -> Result<(), postgres::Error> {
        if self.leave.is_empty() {
            return Ok(());
        }
        t.batch_execute(&self.leave)
    }
}
