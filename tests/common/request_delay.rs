//! A proxy that holds back chosen Kafka requests: in front of a cluster
//! started with `Cluster::start_behind_proxy` (so every connection a host
//! makes crosses it), it reads each request's header and delays those of
//! one API from clients whose id ends with a given suffix, then sends them
//! on, even after their client has gone: a request still on its way when
//! its client is dropped, the window of eos-audit-3 finding 9 (a fencing
//! probe's `InitProducerId` handled after the real producer's).
//!
//! toxiproxy, which the other drills use, delays every byte of a
//! connection alike and cannot tell one request (or client) from another;
//! this is the only thing it cannot do here. Requests are framed by their
//! 4-byte size and their header (api key, version, correlation id, client
//! id) read, nothing else: a connection's requests keep their order, and
//! answers pass untouched.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use super::cluster::Cluster;

/// Kafka's API key of `InitProducerId`.
pub const INIT_PRODUCER_ID: i16 = 22;

/// Kafka's API key of `AddOffsetsToTxn`.
pub const ADD_OFFSETS_TO_TXN: i16 = 25;

pub struct RequestDelay {
    stop: Arc<AtomicBool>,
    delayed: Arc<AtomicUsize>,
    /// How many more matching requests to hold back.
    budget: Arc<AtomicUsize>,
}

impl RequestDelay {
    /// Listens where `cluster`'s brokers send the hosts and delays by
    /// `delay` every request of `api_key` from a client id ending in
    /// `suffix`.
    pub fn start(cluster: &Cluster, api_key: i16, suffix: &str, delay: Duration) -> RequestDelay {
        Self::with_budget(cluster, api_key, suffix, delay, usize::MAX)
    }

    /// As [`RequestDelay::start`], but holding nothing back until
    /// [`RequestDelay::hold_next`] says how many.
    pub fn start_unarmed(
        cluster: &Cluster,
        api_key: i16,
        suffix: &str,
        delay: Duration,
    ) -> RequestDelay {
        Self::with_budget(cluster, api_key, suffix, delay, 0)
    }

    /// Holds back the next `n` matching requests (and no more).
    pub fn hold_next(&self, n: usize) {
        self.budget.store(n, Ordering::SeqCst);
    }

    fn with_budget(
        cluster: &Cluster,
        api_key: i16,
        suffix: &str,
        delay: Duration,
        budget: usize,
    ) -> RequestDelay {
        let budget = Arc::new(AtomicUsize::new(budget));
        let proxy_port = cluster
            .proxy_port
            .expect("RequestDelay needs a cluster started with Cluster::start_behind_proxy");
        let stop = Arc::new(AtomicBool::new(false));
        let delayed = Arc::new(AtomicUsize::new(0));
        for i in 1..=cluster.brokers {
            let listen = proxy_port + i as u16 - 1;
            let upstream = cluster.broker_port(i);
            let listener = TcpListener::bind(("127.0.0.1", listen)).unwrap_or_else(|e| {
                panic!("the delay proxy cannot listen on 127.0.0.1:{listen}: {e}")
            });
            listener
                .set_nonblocking(true)
                .expect("a non-blocking listener");
            let (stop, delayed, budget, suffix) = (
                stop.clone(),
                delayed.clone(),
                budget.clone(),
                suffix.to_owned(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let rule = Rule {
                                api_key,
                                suffix: suffix.clone(),
                                delay,
                                delayed: delayed.clone(),
                                budget: budget.clone(),
                            };
                            std::thread::spawn(move || relay(client, upstream, rule));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
        }
        RequestDelay {
            stop,
            delayed,
            budget,
        }
    }

    /// How many requests were held back so far.
    pub fn delayed(&self) -> usize {
        self.delayed.load(Ordering::Relaxed)
    }
}

impl Drop for RequestDelay {
    fn drop(&mut self) {
        // The listeners stop; open connections end with their clients.
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Rule {
    api_key: i16,
    suffix: String,
    delay: Duration,
    delayed: Arc<AtomicUsize>,
    budget: Arc<AtomicUsize>,
}

/// One client connection: answers copied back as they come, requests
/// forwarded one frame at a time, the chosen ones after the delay.
fn relay(client: TcpStream, upstream_port: u16, rule: Rule) {
    let _ = client.set_nodelay(true);
    let Ok(broker) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = broker.set_nodelay(true);
    let (Ok(mut from_broker), Ok(mut to_client)) = (broker.try_clone(), client.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_broker, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Both);
    });
    let (mut from_client, mut to_broker) = (client, broker);
    let mut held_back = false;
    loop {
        let mut size = [0u8; 4];
        if from_client.read_exact(&mut size).is_err() {
            break;
        }
        let mut frame = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
        if from_client.read_exact(&mut frame).is_err() {
            break;
        }
        if rule.matches(&frame) && rule.take_one() {
            rule.delayed.fetch_add(1, Ordering::Relaxed);
            held_back = true;
            std::thread::sleep(rule.delay);
        }
        if to_broker
            .write_all(&size)
            .and_then(|()| to_broker.write_all(&frame))
            .is_err()
        {
            break;
        }
    }
    if held_back {
        // The client may be gone: give the broker time to read and handle
        // the late request before the connection closes.
        std::thread::sleep(Duration::from_secs(1));
    }
    let _ = to_broker.shutdown(Shutdown::Both);
}

impl Rule {
    /// Whether the budget allows holding one more back (and takes it).
    fn take_one(&self) -> bool {
        self.budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// A request header: api key (2 bytes), version (2), correlation id
    /// (4), client id (a 2-byte length, then the bytes).
    fn matches(&self, frame: &[u8]) -> bool {
        if frame.len() < 10 || i16::from_be_bytes([frame[0], frame[1]]) != self.api_key {
            return false;
        }
        let len = i16::from_be_bytes([frame[8], frame[9]]);
        let Ok(len) = usize::try_from(len) else {
            return false;
        };
        frame
            .get(10..10 + len)
            .is_some_and(|id| id.ends_with(self.suffix.as_bytes()))
    }
}
