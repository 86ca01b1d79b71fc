package onceflow.twin;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InterruptException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The twin of an Onceflow exactly_once_v2 worker on Kafka's Java client (bench/eos-twin/README.md).
 *
 * <p>Three threads: <b>load</b> (an idempotent producer writing sequential ids to the input topic), <b>eos</b> (a
 * read_committed consumer and a transactional producer: poll, begin, send, sendOffsetsToTransaction, commit; any
 * exception restarts the session with fresh clients) and <b>watcher</b> (a consumer of the same group that never
 * subscribes and every 500 ms times {@code committed(...)}, an OffsetFetch with require_stable=true). When the load
 * is done and the group committed every input offset, it reads the output topic read_committed and checks that
 * every input id is there exactly once.
 *
 * <p>Options: {@code --name value} or {@code -Dtwin.name=value}; see {@link Opts}.
 */
public final class EosTwin {

    // ------------------------------------------------------------------------------------------------------------
    // Options

    static final class Opts {
        final Map<String, String> given = new LinkedHashMap<>();

        Opts(String[] args) {
            for (int i = 0; i < args.length; i++) {
                String a = args[i];
                if (!a.startsWith("--")) throw new IllegalArgumentException("unexpected argument: " + a);
                String k = a.substring(2);
                String v;
                int eq = k.indexOf('=');
                if (eq >= 0) {
                    v = k.substring(eq + 1);
                    k = k.substring(0, eq);
                } else {
                    if (i + 1 >= args.length) throw new IllegalArgumentException(a + " needs a value");
                    v = args[++i];
                }
                given.put(k, v);
            }
        }

        String str(String k, String dflt) {
            String v = given.get(k);
            if (v == null) v = System.getProperty("twin." + k);
            return v == null ? dflt : v;
        }

        long num(String k, long dflt) {
            return Long.parseLong(str(k, Long.toString(dflt)));
        }

        boolean bool(String k, boolean dflt) {
            return Boolean.parseBoolean(str(k, Boolean.toString(dflt)));
        }
    }

    final String bootstrap;
    final String input;
    final String output;
    final String group;
    final String txid;
    final int partitions;
    final long records;
    final long rate;
    final long preload;
    final long gate;
    final long maxSecs;
    final long catchupSecs;
    final long commitIntervalMs;
    final long txnTimeoutMs;
    final long fetchTimeoutMs;
    final long watchIntervalMs;
    final long stallMs;
    final long slowMs;
    final boolean staticMember;
    final String instanceId;
    final boolean emulateSessionTimeout;
    final long sessionTimeoutGapMs;
    final Path stopFile;
    final Path statusFile;
    final Path reportFile;
    final Path eventsFile;

    EosTwin(Opts o) {
        String name = o.str("name", "twin-" + System.currentTimeMillis());
        bootstrap = o.str("bootstrap", "127.0.0.1:31092");
        input = o.str("input", name + "-in");
        output = o.str("output", name + "-out");
        group = o.str("group", name + "-group");
        txid = o.str("transactional-id", name + "-tx");
        partitions = (int) o.num("partitions", 6);
        records = o.num("records", 60_000);
        rate = o.num("rate", 1_000); // records/s; 0 = as fast as possible
        preload = o.num("preload", 0); // produced (unthrottled) before the eos loop starts
        gate = o.num("gate", 0); // after the preload, the rest waits until the loop committed this many
        maxSecs = o.num("max-secs", 900);
        catchupSecs = o.num("catchup-secs", 300);
        commitIntervalMs = o.num("commit-interval-ms", 100); // Onceflow's default commit interval
        txnTimeoutMs = o.num("transaction-timeout-ms", 10_000); // Onceflow's default
        fetchTimeoutMs = o.num("fetch-timeout-ms", 30_000);
        watchIntervalMs = o.num("watch-interval-ms", 500);
        stallMs = o.num("stall-ms", 10_000);
        slowMs = o.num("slow-ms", 1_000);
        staticMember = o.bool("static", true); // Onceflow's workers are static members (KIP-345)
        instanceId = o.str("instance-id", "twin-a");
        // librdkafka's classic consumer gives its partitions up ("lost") when its coordinator has not answered for
        // session.timeout.ms (SESSTMOUT), and the worker takes them back with a fresh committed-offset fetch; the Java
        // consumer keeps them. With this option the twin restarts its session instead when its consumer sent no
        // heartbeat for the session timeout.
        emulateSessionTimeout = o.bool("emulate-sesstmout", false);
        // librdkafka counts from the coordinator's last answer: here, the last heartbeat response (heartbeat-total).
        sessionTimeoutGapMs = o.num("sesstmout-ms", 10_000);
        stopFile = path(o.str("stop-file", ""));
        statusFile = path(o.str("status-file", ""));
        reportFile = path(o.str("report-file", ""));
        eventsFile = path(o.str("events-file", ""));
    }

    private static Path path(String s) {
        return s.isEmpty() ? null : Path.of(s);
    }

    // ------------------------------------------------------------------------------------------------------------
    // Logging

    static synchronized void log(String fmt, Object... args) {
        System.out.printf("%s [%s] %s%n", Instant.now(), Thread.currentThread().getName(), String.format(fmt, args));
        System.out.flush();
    }

    static String describe(Throwable e) {
        StringBuilder b = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause() == t ? null : t.getCause()) {
            if (b.length() > 0) b.append(" <- ");
            b.append(t.getClass().getSimpleName()).append(": ").append(t.getMessage());
        }
        return b.toString();
    }

    static long now() {
        return System.currentTimeMillis();
    }

    // ------------------------------------------------------------------------------------------------------------
    // Shared state

    final long startedAt = now();
    final CountDownLatch eosStart = new CountDownLatch(1);
    final AtomicLong sent = new AtomicLong();
    final AtomicLong acked = new AtomicLong();
    final AtomicLong sendFailures = new AtomicLong();
    volatile boolean loadDone;
    volatile long loadDoneAt = Long.MAX_VALUE;
    volatile boolean stopLoad;
    final java.util.concurrent.ConcurrentLinkedQueue<String> resend = new java.util.concurrent.ConcurrentLinkedQueue<>();

    final AtomicLong txnRecords = new AtomicLong();
    final AtomicLong txns = new AtomicLong();
    final AtomicLong sessions = new AtomicLong();
    final AtomicLong restarts = new AtomicLong();
    final AtomicLong maxCommitMs = new AtomicLong();
    final AtomicLong maxAssignMs = new AtomicLong();
    final AtomicLong maxPositionsMs = new AtomicLong();
    final AtomicLong maxHeartbeatGapMs = new AtomicLong();
    final List<String> restartCauses = new ArrayList<>();
    volatile boolean stopEos;

    static final class Sample {
        final long startMs;
        final long latencyMs;
        final String outcome; // ok | timeout | error
        final boolean stall;

        Sample(long startMs, long latencyMs, String outcome, boolean stall) {
            this.startMs = startMs;
            this.latencyMs = latencyMs;
            this.outcome = outcome;
            this.stall = stall;
        }
    }

    final List<Sample> samples = new ArrayList<>();
    volatile long committedSum = -1;
    volatile long endSum = -1;
    volatile boolean caughtUpNow;
    volatile long caughtUpSampleAt = -1; // start of the last sample that saw committed == end everywhere
    volatile long longestStallMs;
    volatile long currentStallStart = -1;
    volatile boolean stopWatcher;

    // ------------------------------------------------------------------------------------------------------------
    // Clients

    Properties common(String clientId) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", clientId);
        return p;
    }

    KafkaProducer<String, String> loadProducer() {
        Properties p = common("twin-load");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        // Retry forever through broker outages.
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Integer.toString(Integer.MAX_VALUE));
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "120000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    KafkaProducer<String, String> txProducer(long session) {
        Properties p = common("twin-eos-p" + session);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txid);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, Long.toString(txnTimeoutMs));
        p.put(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, "5");
        p.put(ProducerConfig.RETRY_BACKOFF_MAX_MS_CONFIG, "100");
        // Onceflow's transactional calls time out after 30 s (TXN_CALL_TIMEOUT).
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    Properties consumerProps(String clientId, String groupId, String isolation) {
        Properties p = common(clientId);
        if (groupId != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, groupId);
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        // As Onceflow's consumers: retry an unstable OffsetFetch at most 100 ms apart.
        p.put(ConsumerConfig.RETRY_BACKOFF_MS_CONFIG, "10");
        p.put(ConsumerConfig.RETRY_BACKOFF_MAX_MS_CONFIG, "100");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        return p;
    }

    KafkaConsumer<String, String> eosConsumer(long session) {
        Properties p = consumerProps("twin-eos-c" + session, group, "read_committed");
        if (staticMember) p.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, instanceId);
        p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, CooperativeStickyAssignor.class.getName());
        p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
        p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        p.put(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG, "300000");
        p.put(ConsumerConfig.FETCH_MIN_BYTES_CONFIG, Integer.toString(64 << 10));
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "10");
        p.put(ConsumerConfig.METRIC_REPORTER_CLASSES_CONFIG, HeartbeatReporter.class.getName());
        return new KafkaConsumer<>(p);
    }

    Admin admin() {
        Properties p = common("twin-admin");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "15000");
        return Admin.create(p);
    }

    static void quietly(String what, Runnable r) {
        try {
            r.run();
        } catch (Exception e) {
            log("%s: %s", what, describe(e));
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // Topics

    void createTopics() throws Exception {
        try (Admin a = admin()) {
            for (String t : List.of(input, output)) {
                try {
                    a.createTopics(List.of(new NewTopic(t, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
                    log("created topic %s (%d partitions)", t, partitions);
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof TopicExistsException)) throw e;
                    log("topic %s exists", t);
                }
            }
        }
    }

    List<TopicPartition> inputPartitions() {
        List<TopicPartition> l = new ArrayList<>();
        for (int i = 0; i < partitions; i++) l.add(new TopicPartition(input, i));
        return l;
    }

    // ------------------------------------------------------------------------------------------------------------
    // Load

    void load() {
        try (KafkaProducer<String, String> p = loadProducer()) {
            long paceStart = System.nanoTime();
            long paced = 0;
            if (preload == 0) eosStart.countDown();
            for (long n = 0; n < records && !stopLoad; n++) {
                if (preload > 0 && n == preload) {
                    waitAcked(p);
                    log("preload of %d records acknowledged; starting the eos loop", preload);
                    eosStart.countDown();
                    while (!stopLoad && txnRecords.get() < gate) sleep(20);
                    log("gate: the loop committed %d records; producing the rest", txnRecords.get());
                    paceStart = System.nanoTime();
                    paced = 0;
                }
                if (rate > 0 && n >= preload) {
                    long due = paceStart + paced * 1_000_000_000L / rate;
                    long ahead = due - System.nanoTime();
                    if (ahead > 2_000_000L) sleep(ahead / 1_000_000L);
                    paced++;
                }
                for (String v; (v = resend.poll()) != null; ) send(p, v);
                send(p, Long.toString(n));
            }
            eosStart.countDown();
            waitAcked(p);
            log("load done: sent %d, acknowledged %d, failed %d in %d ms", sent.get(), acked.get(),
                    sendFailures.get(), now() - startedAt);
            p.close(Duration.ofSeconds(10));
        } catch (Exception e) {
            log("load: %s", describe(e));
        } finally {
            eosStart.countDown();
            loadDoneAt = now();
            loadDone = true;
        }
    }

    /** Sends one id; a record that fails (it should not: delivery.timeout.ms is unbounded) is sent again. */
    private void send(KafkaProducer<String, String> p, String value) {
        long n = Long.parseLong(value);
        ProducerRecord<String, String> r = new ProducerRecord<>(input, "k" + (n % 1000), value);
        while (true) {
            try {
                p.send(r, (md, e) -> {
                    if (e == null) {
                        acked.incrementAndGet();
                    } else {
                        if (sendFailures.incrementAndGet() <= 20) {
                            log("load: delivery failed for %s (sending it again): %s", value, describe(e));
                        }
                        resend.add(value);
                    }
                });
                sent.incrementAndGet();
                return;
            } catch (TimeoutException e) {
                log("load: send blocked: %s; retrying", describe(e));
                if (stopLoad) return;
            }
        }
    }

    /** Until every record sent was acknowledged (failed ones are sent again). */
    private void waitAcked(KafkaProducer<String, String> p) {
        while (!stopLoad) {
            p.flush();
            boolean again = false;
            for (String v; (v = resend.poll()) != null; again = true) send(p, v);
            if (!again && acked.get() + sendFailures.get() >= sent.get() && resend.isEmpty()) return;
            sleep(50);
        }
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(Math.max(0, ms));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // The eos loop

    void eosLoop() {
        try {
            eosStart.await();
        } catch (InterruptedException e) {
            return;
        }
        while (!stopEos) {
            long session = sessions.incrementAndGet();
            long sessionStart = now();
            KafkaProducer<String, String> p = null;
            KafkaConsumer<String, String> c = null;
            boolean failed = false;
            boolean inTxn = false;
            try {
                p = txProducer(session);
                p.initTransactions();
                log("session %d: initTransactions took %d ms", session, now() - sessionStart);
                final KafkaConsumer<String, String> consumer = eosConsumer(session);
                c = consumer;
                sessionLostGapMs = 0;
                monitoredSince = Long.MAX_VALUE;
                monitoredClient = "twin-eos-c" + session;
                final long subscribedAt = now();
                final AtomicLong assignedAt = new AtomicLong(Long.MAX_VALUE);
                consumer.subscribe(List.of(input), new ConsumerRebalanceListener() {
                    boolean first = true;

                    @Override
                    public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                        if (parts.isEmpty()) return;
                        long t = now();
                        // The positions of a fresh assignment come from the group's committed offsets: for a
                        // read_committed consumer an OffsetFetch with require_stable=true.
                        Map<Integer, Long> pos = new TreeMap<>();
                        for (TopicPartition tp : parts) pos.put(tp.partition(), consumer.position(tp, Duration.ofSeconds(60)));
                        long fetched = now();
                        assignedAt.set(fetched);
                        if (monitoredSince == Long.MAX_VALUE) monitoredSince = fetched;
                        long sinceSubscribe = fetched - subscribedAt;
                        if (first) {
                            maxAssignMs.accumulateAndGet(sinceSubscribe, Math::max);
                            maxPositionsMs.accumulateAndGet(fetched - t, Math::max);
                        }
                        log("session %d: %s %d partitions %d ms after subscribe; positions (stable committed-offset "
                                        + "fetch) took %d ms: %s", session, first ? "first assignment," : "assigned",
                                parts.size(), sinceSubscribe, fetched - t, pos);
                        first = false;
                    }

                    @Override
                    public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                        if (!parts.isEmpty()) log("session %d: revoked %s", session, parts);
                    }

                    @Override
                    public void onPartitionsLost(Collection<TopicPartition> parts) {
                        if (!parts.isEmpty()) log("session %d: lost %s", session, parts);
                    }
                });
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                long txnStart = 0;
                long txnCount = 0;
                while (!stopEos || inTxn) {
                    long lost = sessionLostGapMs;
                    if (lost > 0) {
                        throw new KafkaException(String.format("emulated SESSTMOUT: no heartbeat answered for %d ms "
                                + "(librdkafka revokes its partitions as lost and rejoins)", lost));
                    }
                    ConsumerRecords<String, String> recs = consumer.poll(Duration.ofMillis(inTxn ? 10 : 100));
                    if (!recs.isEmpty()) {
                        if (!inTxn) {
                            p.beginTransaction();
                            inTxn = true;
                            txnStart = now();
                            txnCount = 0;
                        }
                        for (ConsumerRecord<String, String> r : recs) {
                            p.send(new ProducerRecord<>(output, r.key(), r.value()));
                            offsets.put(new TopicPartition(r.topic(), r.partition()),
                                    new OffsetAndMetadata(r.offset() + 1, r.leaderEpoch(), ""));
                        }
                        txnCount += recs.count();
                    }
                    if (inTxn && (stopEos || now() - txnStart >= commitIntervalMs)) {
                        p.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                        long t0 = now();
                        p.commitTransaction();
                        inTxn = false;
                        long took = now() - t0;
                        maxCommitMs.accumulateAndGet(took, Math::max);
                        if (took > 5_000) log("session %d: commitTransaction took %d ms", session, took);
                        offsets.clear();
                        txns.incrementAndGet();
                        txnRecords.addAndGet(txnCount);
                    }
                }
            } catch (Exception e) {
                failed = true;
                long n = restarts.incrementAndGet();
                String cause = describe(e);
                synchronized (restartCauses) {
                    restartCauses.add(e.getClass().getSimpleName());
                }
                log("SESSION-RESTART #%d (session %d, %d ms old, in transaction: %s): %s", n, session,
                        now() - sessionStart, inTxn, cause);
                if (p != null && inTxn) {
                    final KafkaProducer<String, String> fp = p;
                    quietly("session " + session + ": abortTransaction", fp::abortTransaction);
                }
            } finally {
                if (c != null) {
                    final KafkaConsumer<String, String> fc = c;
                    quietly("session " + session + ": consumer close", () -> fc.close(org.apache.kafka.clients.consumer.CloseOptions.timeout(Duration.ofSeconds(5))));
                }
                if (p != null) {
                    final KafkaProducer<String, String> fp = p;
                    quietly("session " + session + ": producer close", () -> fp.close(Duration.ofSeconds(5)));
                }
            }
            if (failed && !stopEos) sleep(200);
        }
        log("eos loop stopped after %d sessions", sessions.get());
    }

    /**
     * Hands each eos consumer's heartbeat-total metric (heartbeat responses received, errors included) to the
     * monitor thread: KafkaMetric.metricValue() is thread-safe, the consumer is not.
     */
    public static final class HeartbeatReporter implements org.apache.kafka.common.metrics.MetricsReporter {
        static final java.util.concurrent.ConcurrentHashMap<String, org.apache.kafka.common.metrics.KafkaMetric>
                HEARTBEATS = new java.util.concurrent.ConcurrentHashMap<>();

        @Override
        public void configure(Map<String, ?> configs) {
        }

        @Override
        public void init(List<org.apache.kafka.common.metrics.KafkaMetric> metrics) {
            metrics.forEach(this::metricChange);
        }

        @Override
        public void metricChange(org.apache.kafka.common.metrics.KafkaMetric m) {
            if (m.metricName().name().equals("heartbeat-total")
                    && m.metricName().group().equals("consumer-coordinator-metrics")) {
                String id = m.metricName().tags().get("client-id");
                if (id != null) HEARTBEATS.put(id, m);
            }
        }

        @Override
        public void metricRemoval(org.apache.kafka.common.metrics.KafkaMetric m) {
        }

        @Override
        public void close() {
        }
    }

    volatile String monitoredClient;
    volatile long monitoredSince = Long.MAX_VALUE; // the session's first assignment
    volatile long sessionLostGapMs; // set by the monitor: no heartbeat answered for this long

    /**
     * librdkafka's view of the session: its background thread gives the partitions up once the coordinator has
     * not answered for session.timeout.ms, whatever the application thread is doing (blocked in a commit, say).
     */
    void heartbeatMonitor() {
        String client = null;
        double last = -1;
        long lastChange = 0;
        while (!stopEos) {
            sleep(100);
            String c = monitoredClient;
            long since = monitoredSince;
            org.apache.kafka.common.metrics.KafkaMetric m = c == null ? null : HeartbeatReporter.HEARTBEATS.get(c);
            if (m == null || since == Long.MAX_VALUE) continue;
            if (!c.equals(client)) {
                client = c;
                last = -1;
                lastChange = now();
            }
            Object v = m.metricValue();
            double h = v instanceof Number ? ((Number) v).doubleValue() : -1;
            if (h != last) {
                last = h;
                lastChange = now();
            }
            long gap = now() - Math.max(lastChange, since);
            maxHeartbeatGapMs.accumulateAndGet(gap, Math::max);
            if (emulateSessionTimeout && gap >= sessionTimeoutGapMs && sessionLostGapMs == 0) {
                sessionLostGapMs = gap;
                log("emulated SESSTMOUT for %s: no heartbeat answered for %d ms", c, gap);
            }
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // The watcher

    void watch() {
        Properties props = consumerProps("twin-watcher", group, "read_committed");
        List<TopicPartition> parts = inputPartitions();
        Set<TopicPartition> partSet = new HashSet<>(parts);
        long nextEndOffsets = 0;
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(props); Admin admin = admin()) {
            while (!stopWatcher) {
                long t0 = now();
                String outcome;
                Map<TopicPartition, OffsetAndMetadata> committed = null;
                try {
                    // The Java consumer always sends OffsetFetch with require_stable=true.
                    committed = c.committed(partSet, Duration.ofMillis(fetchTimeoutMs));
                    outcome = "ok";
                } catch (TimeoutException e) {
                    outcome = "timeout";
                } catch (WakeupException | InterruptException e) {
                    break;
                } catch (KafkaException e) {
                    outcome = "error";
                    log("watcher: committed(): %s", describe(e));
                }
                long lat = now() - t0;
                boolean stall = outcome.equals("timeout") || lat > stallMs;
                synchronized (samples) {
                    samples.add(new Sample(t0, lat, outcome, stall));
                }
                boolean postUp = false;
                if (stall) {
                    if (currentStallStart < 0) currentStallStart = t0;
                    longestStallMs = Math.max(longestStallMs, now() - currentStallStart);
                    long up = lastUp();
                    postUp = up >= 0 && t0 >= up;
                    if (now() - currentStallStart >= 60_000) {
                        log("watcher: LONG-STALL: stable fetches stalled for %d ms", now() - currentStallStart);
                    }
                } else if (currentStallStart >= 0) {
                    log("watcher: stall over after %d ms", now() - currentStallStart);
                    currentStallStart = -1;
                }
                if (lat > slowMs) {
                    log("watcher: %s stable committed-offset fetch started %s: %d ms (%s)",
                            stall ? (postUp ? "STALL (post-up)" : "STALL") : "slow", Instant.ofEpochMilli(t0), lat,
                            outcome);
                }
                if (stall) diagnose(admin);
                if (committed != null && (loadDone || t0 >= nextEndOffsets)) {
                    nextEndOffsets = t0 + 10_000;
                    long sum = 0;
                    boolean all = true;
                    Map<TopicPartition, Long> com = new HashMap<>();
                    for (TopicPartition tp : parts) {
                        OffsetAndMetadata om = committed.get(tp);
                        if (om == null) {
                            all = false;
                        } else {
                            sum += om.offset();
                            com.put(tp, om.offset());
                        }
                    }
                    committedSum = sum;
                    try {
                        Map<TopicPartition, Long> end = c.endOffsets(parts, Duration.ofSeconds(5));
                        long es = 0;
                        boolean caught = all;
                        for (TopicPartition tp : parts) {
                            long e = end.get(tp);
                            es += e;
                            if (com.getOrDefault(tp, -1L) < e) caught = false;
                        }
                        endSum = es;
                        caughtUpNow = caught;
                        if (caught) caughtUpSampleAt = t0;
                    } catch (TimeoutException e) {
                        log("watcher: endOffsets timed out");
                    } catch (KafkaException e) {
                        log("watcher: endOffsets: %s", describe(e));
                    }
                }
                long wait = t0 + watchIntervalMs - now();
                if (wait > 0) sleep(wait);
            }
        } catch (Exception e) {
            log("watcher: %s", describe(e));
        }
    }

    int offsetsTopicPartitions = -1;

    /** What the broker says while stable fetches stall: unstable offsets, the transaction, open producers. */
    void diagnose(Admin a) {
        try {
            Map<TopicPartition, OffsetAndMetadata> m =
                    a.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(10, TimeUnit.SECONDS);
            Map<Integer, Long> off = new TreeMap<>();
            m.forEach((tp, om) -> {
                if (tp.topic().equals(input)) off.put(tp.partition(), om == null ? null : om.offset());
            });
            log("diag: committed offsets without require_stable (admin): %s", off);
        } catch (Exception e) {
            log("diag: listConsumerGroupOffsets: %s", describe(e));
        }
        try {
            TransactionDescription d = a.describeTransactions(List.of(txid)).description(txid).get(10, TimeUnit.SECONDS);
            log("diag: transaction %s: state %s, producer %d epoch %d, coordinator %d, started %s, partitions %s",
                    txid, d.state(), d.producerId(), d.producerEpoch(), d.coordinatorId(),
                    d.transactionStartTimeMs().isPresent() ? Instant.ofEpochMilli(d.transactionStartTimeMs().getAsLong()) : "-",
                    d.topicPartitions());
        } catch (Exception e) {
            log("diag: describeTransactions: %s", describe(e));
        }
        try {
            ConsumerGroupDescription g = a.describeConsumerGroups(List.of(group)).describedGroups().get(group)
                    .get(10, TimeUnit.SECONDS);
            log("diag: group %s: state %s, %d members, coordinator %s", group, g.groupState(), g.members().size(),
                    g.coordinator());
        } catch (Exception e) {
            log("diag: describeConsumerGroups: %s", describe(e));
        }
        try {
            if (offsetsTopicPartitions < 0) {
                TopicDescription td = a.describeTopics(List.of("__consumer_offsets")).allTopicNames()
                        .get(10, TimeUnit.SECONDS).get("__consumer_offsets");
                offsetsTopicPartitions = td.partitions().size();
            }
            int h = group.hashCode();
            int gp = (h == Integer.MIN_VALUE ? 0 : Math.abs(h)) % offsetsTopicPartitions;
            List<TopicPartition> tps = new ArrayList<>();
            tps.add(new TopicPartition("__consumer_offsets", gp));
            for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(output, i));
            Map<TopicPartition, PartitionProducerState> st = a.describeProducers(tps).all().get(10, TimeUnit.SECONDS);
            for (TopicPartition tp : tps) {
                PartitionProducerState s = st.get(tp);
                if (s == null) continue;
                List<String> open = new ArrayList<>();
                for (ProducerState ps : s.activeProducers()) {
                    if (ps.currentTransactionStartOffset().isPresent()) {
                        open.add("producer " + ps.producerId() + " epoch " + ps.producerEpoch() + " txn from offset "
                                + ps.currentTransactionStartOffset().getAsLong() + " last "
                                + Instant.ofEpochMilli(ps.lastTimestamp()));
                    }
                }
                if (tp.topic().equals("__consumer_offsets") || !open.isEmpty()) {
                    log("diag: %s: %d active producers, open transactions: %s", tp, s.activeProducers().size(), open);
                }
            }
        } catch (Exception e) {
            log("diag: describeProducers: %s", describe(e));
        }
    }

    // ------------------------------------------------------------------------------------------------------------
    // Verification

    /** Counts of each id in a topic, read from the beginning to its end offsets (the LSO if read_committed). */
    Map<Long, Integer> readIds(String topic, String isolation, long[] totalAndBad) {
        Map<Long, Integer> counts = new HashMap<>();
        Properties props = consumerProps("twin-verify", null, isolation);
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(props)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo pi : c.partitionsFor(topic, Duration.ofSeconds(30))) {
                tps.add(new TopicPartition(topic, pi.partition()));
            }
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(30));
            long deadline = now() + 120_000;
            while (now() < deadline) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    if (c.position(tp, Duration.ofSeconds(30)) < end.get(tp)) done = false;
                }
                if (done) break;
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    totalAndBad[0]++;
                    try {
                        counts.merge(Long.parseLong(r.value()), 1, Integer::sum);
                    } catch (RuntimeException e) {
                        totalAndBad[1]++;
                    }
                }
            }
            if (now() >= deadline) log("verify: %s not read to its end in 120 s", topic);
        }
        return counts;
    }

    // ------------------------------------------------------------------------------------------------------------
    // Main

    void writeStatus() {
        if (statusFile == null) return;
        String s = "sent=" + sent.get() + "\nacked=" + acked.get() + "\nload_done=" + loadDone + "\ntxn_committed="
                + txnRecords.get() + "\ntxns=" + txns.get() + "\nsessions=" + sessions.get() + "\nrestarts="
                + restarts.get() + "\ncommitted_sum=" + committedSum + "\nend_sum=" + endSum + "\ncaught_up="
                + caughtUpNow + "\nstall_samples=" + stallCount() + "\n";
        try {
            Path tmp = statusFile.resolveSibling(statusFile.getFileName() + ".tmp");
            Files.writeString(tmp, s, StandardCharsets.UTF_8);
            Files.move(tmp, statusFile, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException e) {
            log("status: %s", describe(e));
        }
    }

    long stallCount() {
        synchronized (samples) {
            return samples.stream().filter(x -> x.stall).count();
        }
    }

    /** The last "up" event's time (the broker serves again), from the events file the soak script writes. */
    long lastUp() {
        long up = -1;
        if (eventsFile == null || !Files.exists(eventsFile)) return up;
        try {
            for (String line : Files.readAllLines(eventsFile)) {
                String[] w = line.trim().split("\\s+");
                if (w.length >= 2 && w[0].equals("up")) up = Long.parseLong(w[1]);
            }
        } catch (IOException | RuntimeException e) {
            log("events: %s", describe(e));
        }
        return up;
    }

    int run() throws Exception {
        log("eos-twin: bootstrap %s input %s output %s group %s transactional.id %s; %d records at %s/s "
                        + "(preload %d, gate %d); commit interval %d ms, transaction timeout %d ms, static member %s",
                bootstrap, input, output, group, txid, records, rate == 0 ? "max" : Long.toString(rate), preload, gate,
                commitIntervalMs, txnTimeoutMs, staticMember);
        if (emulateSessionTimeout) {
            log("emulating librdkafka's SESSTMOUT: no heartbeat answered for %d ms restarts the session",
                    sessionTimeoutGapMs);
        }
        createTopics();
        Thread watcher = new Thread(this::watch, "watcher");
        Thread eos = new Thread(this::eosLoop, "eos");
        Thread load = new Thread(this::load, "load");
        Thread monitor = new Thread(this::heartbeatMonitor, "heartbeats");
        monitor.setDaemon(true);
        monitor.start();
        watcher.setDaemon(true);
        eos.setDaemon(true);
        load.setDaemon(true);
        watcher.start();
        eos.start();
        load.start();

        String reason;
        long deadline = startedAt + maxSecs * 1000;
        while (true) {
            sleep(250);
            writeStatus();
            if (stopFile != null && Files.exists(stopFile)) {
                reason = "stop-file";
                break;
            }
            if (now() > deadline) {
                reason = "max-secs";
                break;
            }
            if (loadDone && caughtUpSampleAt > loadDoneAt) {
                reason = "caught-up";
                break;
            }
            if (loadDone && now() > loadDoneAt + catchupSecs * 1000) {
                reason = "catchup-timeout";
                break;
            }
        }
        long endAt = now();
        boolean caughtUp = reason.equals("caught-up");
        log("stopping (%s) after %d ms; load done %d ms before", reason, endAt - startedAt,
                loadDone ? endAt - loadDoneAt : -1);
        stopLoad = true;
        stopEos = true;
        eos.join(90_000);
        stopWatcher = true;
        watcher.join(45_000);
        load.join(15_000);
        writeStatus();

        // Verification: every input id in the committed output exactly once.
        long[] inTB = new long[2];
        long[] outTB = new long[2];
        Map<Long, Integer> in = readIds(input, "read_uncommitted", inTB);
        Map<Long, Integer> out = readIds(output, "read_committed", outTB);
        long missing = 0, dups = 0, unknown = 0, inputDups = 0;
        List<Long> missingEx = new ArrayList<>(), dupEx = new ArrayList<>();
        for (Map.Entry<Long, Integer> e : in.entrySet()) {
            int ic = e.getValue(), oc = out.getOrDefault(e.getKey(), 0);
            if (ic > 1) inputDups += ic - 1;
            if (oc < ic) {
                missing += ic - oc;
                if (missingEx.size() < 10) missingEx.add(e.getKey());
            } else if (oc > ic) {
                dups += oc - ic;
                if (dupEx.size() < 10) dupEx.add(e.getKey());
            }
        }
        for (Map.Entry<Long, Integer> e : out.entrySet()) if (!in.containsKey(e.getKey())) unknown += e.getValue();
        if (!missingEx.isEmpty()) log("verify: missing ids, e.g. %s", missingEx);
        if (!dupEx.isEmpty()) log("verify: duplicated ids, e.g. %s", dupEx);

        List<Long> lats = new ArrayList<>();
        long stallsN, postUpStalls = 0, timeouts = 0;
        long up = lastUp();
        synchronized (samples) {
            for (Sample s : samples) {
                lats.add(s.latencyMs);
                if (s.outcome.equals("timeout")) timeouts++;
                if (s.stall && up >= 0 && s.startMs >= up) postUpStalls++;
            }
            stallsN = samples.stream().filter(x -> x.stall).count();
        }
        lats.sort(null);
        long max = lats.isEmpty() ? 0 : lats.get(lats.size() - 1);
        long p99 = lats.isEmpty() ? 0 : lats.get(Math.max(0, (int) Math.ceil(lats.size() * 0.99) - 1));
        boolean exact = caughtUp && missing == 0 && dups == 0 && unknown == 0 && outTB[1] == 0;
        Map<String, Long> causes = new TreeMap<>();
        synchronized (restartCauses) {
            for (String c : restartCauses) causes.merge(c, 1L, Long::sum);
        }
        Map<String, Object> rep = new LinkedHashMap<>();
        rep.put("result", exact ? "exact" : "NOT-EXACT");
        rep.put("stop_reason", reason);
        rep.put("produced", acked.get());
        rep.put("send_failures", sendFailures.get());
        rep.put("input_records", inTB[0]);
        rep.put("input_duplicates", inputDups);
        rep.put("txn_committed_records", txnRecords.get());
        rep.put("txns", txns.get());
        rep.put("output_records", outTB[0]);
        rep.put("duplicates", dups);
        rep.put("missing", missing);
        rep.put("unknown", unknown);
        rep.put("fetch_samples", (long) lats.size());
        rep.put("fetch_max_ms", max);
        rep.put("fetch_p99_ms", p99);
        rep.put("fetch_timeouts", timeouts);
        rep.put("stall_samples", stallsN);
        rep.put("post_up_stall_samples", postUpStalls);
        rep.put("longest_stall_ms", longestStallMs);
        rep.put("session_restarts", restarts.get());
        rep.put("restart_causes", causes.isEmpty() ? "-" : causes.toString().replace(" ", ""));
        rep.put("max_first_assignment_ms", maxAssignMs.get());
        rep.put("max_positions_ms", maxPositionsMs.get());
        rep.put("max_commit_ms", maxCommitMs.get());
        rep.put("max_heartbeat_gap_ms", maxHeartbeatGapMs.get());
        rep.put("elapsed_ms", now() - startedAt);
        StringBuilder line = new StringBuilder("TWIN-SUMMARY");
        StringBuilder file = new StringBuilder();
        rep.forEach((k, v) -> {
            line.append(' ').append(k).append('=').append(v);
            file.append(k).append('=').append(v).append('\n');
        });
        log("%s", line);
        log("TWIN-RESULT %s input=%d output=%d duplicates=%d missing=%d unknown=%d caught_up=%s", exact ? "exact"
                : "NOT-EXACT", inTB[0], outTB[0], dups, missing, unknown, caughtUp);
        if (reportFile != null) Files.writeString(reportFile, file.toString(), StandardCharsets.UTF_8);
        return exact ? 0 : 1;
    }

    public static void main(String[] args) {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel",
                System.getProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn"));
        System.setProperty("org.slf4j.simpleLogger.logFile", "System.out");
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        // Not the connection refusals of every client while the broker is down.
        System.setProperty("org.slf4j.simpleLogger.log.org.apache.kafka.clients.NetworkClient", "error");
        System.setProperty("org.slf4j.simpleLogger.dateTimeFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSX");
        int rc;
        try {
            rc = new EosTwin(new Opts(args)).run();
        } catch (Exception e) {
            log("eos-twin failed: %s", describe(e));
            e.printStackTrace(System.out);
            rc = 2;
        }
        System.out.flush();
        System.exit(rc);
    }
}
