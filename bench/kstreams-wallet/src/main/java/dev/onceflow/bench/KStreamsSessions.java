package dev.onceflow.bench;

import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.SessionStore;

/**
 * The sessions test guest ({@code tests/guests/sessions}) written as a Kafka Streams application
 * (DSL): clicks keyed by user, counted per session with an inactivity gap of 5 seconds and 10
 * seconds of grace, each session emitted when it closes ({@code suppress(untilWindowCloses)}).
 * Late clicks are dropped. The session store keeps sessions for an hour (the guest's window store
 * retention), not the default gap + grace, so that both keep a session as long as a record may
 * still merge into it.
 *
 * <p>Output: key = the user, value = {@code <start> <end> <count>} (epoch ms, the first and last
 * click's times), as the guest emits it.
 *
 * <p>The record cache decides when {@code suppress} sees a session's updates: with it (the default)
 * a session that grows within a commit interval reaches it once, grown; with {@code no-cache} (as in
 * {@code TopologyTestDriver}) every update does, and a session emitted at end + gap + grace is
 * emitted again when it grows.
 *
 * <p>Usage: {@code KStreamsSessions <bootstrap> <application-id> <input-topic> <output-topic>
 * <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir> [cache|no-cache]}. Prints one
 * line to stdout on first reaching RUNNING; runs until SIGTERM.
 */
public final class KStreamsSessions {
  static final Duration GAP = Duration.ofSeconds(5);
  static final Duration GRACE = Duration.ofSeconds(10);
  static final Duration RETENTION = Duration.ofHours(1);
  static final String STORE = "session-counts";

  public static void main(String[] args) throws InterruptedException {
    boolean cache = args.length == 7 || (args.length == 8 && args[7].equals("cache"));
    if (args.length < 7 || args.length > 8 || (args.length == 8 && !cache && !args[7].equals("no-cache"))) {
      System.err.println(
          "usage: KStreamsSessions <bootstrap> <application-id> <input-topic> <output-topic>"
              + " <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir> [cache|no-cache]");
      System.exit(2);
    }
    Topology topology = topology(args[2], args[3], cache);
    Properties props =
        KStreamsPageviews.properties(args[0], args[1], args[4], args[5], args[6]);
    KStreamsPageviews.run("kstreams-sessions", topology, props);
  }

  static Topology topology(String input, String output, boolean cache) {
    Materialized<String, Long, SessionStore<Bytes, byte[]>> store =
        Materialized.<String, Long, SessionStore<Bytes, byte[]>>as(STORE)
            .withKeySerde(Serdes.String())
            .withValueSerde(Serdes.Long())
            .withRetention(RETENTION);
    if (!cache) {
      store = store.withCachingDisabled();
    }
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
        .windowedBy(SessionWindows.ofInactivityGapAndGrace(GAP, GRACE))
        .count(store)
        .suppress(
            Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded())
                .withName("session-final"))
        .toStream()
        // Suppress forwards no tombstones, but a merged-away session's removal passes through
        // the count as a null: skip it.
        .filter((Windowed<String> window, Long count) -> count != null)
        .map(
            (Windowed<String> window, Long count) ->
                KeyValue.pair(
                    window.key(),
                    window.window().start() + " " + window.window().end() + " " + count))
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
    return builder.build();
  }
}
