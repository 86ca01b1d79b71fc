package dev.onceflow.bench;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The Onceflow page-view counter written as a Kafka Streams application (DSL): page views keyed by
 * page path, counted per page in 60-second tumbling event-time windows with 10 seconds of grace,
 * and one final count per (page, window) emitted once the window closes ({@code suppress}). Late
 * views (after the window's grace) are dropped, as Kafka Streams does.
 *
 * <p>Output: key = the page (a plain string), value = {@code
 * {"page":"/home","start":1700000040000,"end":1700000100000,"count":3}} (epoch ms, end exclusive).
 *
 * <p>Usage: {@code KStreamsPageviews <bootstrap> <application-id> <input-topic> <output-topic>
 * <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir>}. Prints one line to stdout on
 * first reaching RUNNING; runs until SIGTERM.
 */
public final class KStreamsPageviews {
  static final Duration WINDOW = Duration.ofSeconds(60);
  static final Duration GRACE = Duration.ofSeconds(10);
  static final String STORE = "pageview-counts";

  public static void main(String[] args) throws InterruptedException {
    if (args.length != 7) {
      System.err.println(
          "usage: KStreamsPageviews <bootstrap> <application-id> <input-topic> <output-topic>"
              + " <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir>");
      System.exit(2);
    }
    String bootstrap = args[0];
    String applicationId = args[1];
    String input = args[2];
    String output = args[3];
    String guarantee = args[4];
    String commitIntervalMs = args[5];
    String stateDir = args[6];

    Topology topology = topology(input, output);
    Properties props = properties(bootstrap, applicationId, guarantee, commitIntervalMs, stateDir);
    run("kstreams-pageviews", topology, props);
  }

  static Topology topology(String input, String output) {
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
        .windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE))
        .count(
            Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()))
        .suppress(
            Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded())
                .withName("pageview-final"))
        .toStream()
        .map((Windowed<String> window, Long count) -> KeyValue.pair(window.key(), render(window, count)))
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
    return builder.build();
  }

  static String render(Windowed<String> window, Long count) {
    StringBuilder json = new StringBuilder(96);
    json.append("{\"page\":");
    Json.string(json, window.key());
    json.append(",\"start\":").append(window.window().start());
    json.append(",\"end\":").append(window.window().end());
    json.append(",\"count\":").append(count.longValue());
    return json.append('}').toString();
  }

  /** The properties every twin shares (one thread, RF 1, earliest, the given guarantee). */
  static Properties properties(
      String bootstrap,
      String applicationId,
      String guarantee,
      String commitIntervalMs,
      String stateDir) {
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, commitIntervalMs);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    // One stream thread, like the Onceflow manifests' worker-threads = 1.
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // The broker is single-node.
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "1");
    return props;
  }

  /**
   * Starts the topology, prints "{@code name}: RUNNING" once on stdout the first time the client
   * reaches RUNNING, and blocks until SIGTERM (clean close leaving the group, 30 s timeout) or a
   * stream-thread failure (exit status 1).
   */
  static void run(String name, Topology topology, Properties props) throws InterruptedException {
    KafkaStreams streams = new KafkaStreams(topology, props);
    CountDownLatch stopped = new CountDownLatch(1);
    AtomicBoolean failed = new AtomicBoolean();
    AtomicBoolean announced = new AtomicBoolean();
    streams.setStateListener(
        (newState, oldState) -> {
          if (newState == KafkaStreams.State.RUNNING && announced.compareAndSet(false, true)) {
            System.out.println(name + ": RUNNING");
            System.out.flush();
          }
        });
    streams.setUncaughtExceptionHandler(
        e -> {
          System.err.println(name + ": stream thread failed: " + e);
          failed.set(true);
          stopped.countDown();
          return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  // Leave the group on close (KafkaStreams.close(Duration) does not): a restarted
                  // instance then joins at once instead of waiting out the old member's session
                  // (session.timeout.ms, 45 s).
                  streams.close(
                      CloseOptions.groupMembershipOperation(
                              CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
                          .withTimeout(Duration.ofSeconds(30)));
                  stopped.countDown();
                }));
    streams.start();
    stopped.await();
    if (failed.get()) {
      System.exit(1);
    }
  }

  /** JSON string output, escaped exactly as serde_json does it (so outputs compare byte for byte). */
  static final class Json {
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private Json() {}

    static void string(StringBuilder out, String s) {
      out.append('"');
      for (int i = 0; i < s.length(); i++) {
        char c = s.charAt(i);
        switch (c) {
          case '"' -> out.append("\\\"");
          case '\\' -> out.append("\\\\");
          case '\b' -> out.append("\\b");
          case '\f' -> out.append("\\f");
          case '\n' -> out.append("\\n");
          case '\r' -> out.append("\\r");
          case '\t' -> out.append("\\t");
          default -> {
            if (c < 0x20) {
              out.append("\\u00").append(HEX[c >> 4]).append(HEX[c & 0xf]);
            } else {
              out.append(c);
            }
          }
        }
      }
      out.append('"');
    }
  }
}
