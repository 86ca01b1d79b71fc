package dev.onceflow.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The Onceflow wallet (examples/wallet) written as a Kafka Streams application, the way a user who
 * picked Kafka Streams instead would write it: Processor API, a persistent RocksDB key-value store
 * (changelogged, cached), one output record per payment to balances and one to audit, malformed
 * payments to a dead-letter topic with the same {@code onceflow.error.*} headers Onceflow writes,
 * so that {@code onceflow verify} checks this application's output exactly like Onceflow's.
 *
 * <p>Usage: {@code KStreamsWallet <bootstrap> <application-id> <payments> <balances> <audit> <dlq>
 * <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir>}. Runs until SIGTERM.
 *
 * <p>The environment variable {@code KSTREAMS_PROPS} adds Streams settings, {@code key=value}
 * pairs separated by commas (the recovery benchmark sets {@code group.instance.id} and {@code
 * enable.transactional.statestores} through it).
 */
public final class KStreamsWallet {
  static final String STORE = "balances";

  public static void main(String[] args) throws InterruptedException {
    if (args.length != 9) {
      System.err.println(
          "usage: KStreamsWallet <bootstrap> <application-id> <payments> <balances> <audit> <dlq>"
              + " <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir>");
      System.exit(2);
    }
    String bootstrap = args[0];
    String applicationId = args[1];
    String payments = args[2];
    String balances = args[3];
    String audit = args[4];
    String dlq = args[5];
    String guarantee = args[6];
    String commitIntervalMs = args[7];
    String stateDir = args[8];

    Topology topology = new Topology();
    topology.addSource(
        "payments", Serdes.String().deserializer(), Serdes.ByteArray().deserializer(), payments);
    topology.addProcessor("wallet", () -> new WalletProcessor(applicationId), "payments");
    topology.addStateStore(
        Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.Long())
            .withCachingEnabled(),
        "wallet");
    topology.addSink(
        "balances", balances, Serdes.String().serializer(), Serdes.ByteArray().serializer(), "wallet");
    topology.addSink(
        "audit", audit, Serdes.String().serializer(), Serdes.ByteArray().serializer(), "wallet");
    topology.addSink(
        "dlq", dlq, Serdes.String().serializer(), Serdes.ByteArray().serializer(), "wallet");

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
    String extra = System.getenv("KSTREAMS_PROPS");
    if (extra != null && !extra.isBlank()) {
      for (String pair : extra.split(",")) {
        int eq = pair.indexOf('=');
        if (eq <= 0) {
          System.err.println("kstreams-wallet: KSTREAMS_PROPS: expected key=value, got: " + pair);
          System.exit(2);
        }
        props.put(pair.substring(0, eq).trim(), pair.substring(eq + 1).trim());
      }
    }

    KafkaStreams streams = new KafkaStreams(topology, props);
    CountDownLatch stopped = new CountDownLatch(1);
    streams.setUncaughtExceptionHandler(
        e -> {
          System.err.println("kstreams-wallet: stream thread failed: " + e);
          stopped.countDown();
          return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
              .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(30));
                  stopped.countDown();
                }));
    streams.start();
    stopped.await();
  }

  /** One payment in, balance + audit out (or one dead letter). */
  static final class WalletProcessor implements Processor<String, byte[], String, byte[]> {
    private static final ObjectMapper JSON = new ObjectMapper();
    private final String applicationId;
    private ProcessorContext<String, byte[]> context;
    private KeyValueStore<String, Long> store;

    WalletProcessor(String applicationId) {
      this.applicationId = applicationId;
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.context = context;
      this.store = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<String, byte[]> record) {
      byte[] raw = record.value();
      String paymentId;
      String account;
      long amount;
      try {
        if (raw == null) {
          throw new InvalidPayment("missing value");
        }
        JsonNode value;
        try {
          value = JSON.readTree(raw);
        } catch (java.io.IOException e) {
          throw new InvalidPayment("not valid JSON");
        }
        if (value == null || !value.isObject()) {
          throw new InvalidPayment("not a JSON object");
        }
        paymentId = stringField(value, "payment_id");
        account = stringField(value, "account");
        JsonNode amountNode = value.get("amount");
        if (amountNode == null) {
          throw new InvalidPayment("missing field \"amount\"");
        }
        if (!amountNode.isIntegralNumber() || !amountNode.canConvertToLong()) {
          throw new InvalidPayment("field \"amount\" must be an integer");
        }
        amount = amountNode.longValue();
      } catch (InvalidPayment e) {
        deadLetter(record, "invalid payment: " + e.getMessage());
        return;
      }
      Long previous = store.get(account);
      long balance;
      try {
        balance = Math.addExact(previous == null ? 0L : previous, amount);
      } catch (ArithmeticException e) {
        deadLetter(
            record, "invalid payment: balance overflow for account " + JSON.valueToTree(account));
        return;
      }
      store.put(account, balance);
      String report =
          "{\"account\":"
              + JSON.valueToTree(account)
              + ",\"balance\":"
              + balance
              + ",\"payment_id\":"
              + JSON.valueToTree(paymentId)
              + "}";
      context.forward(
          new Record<>(account, report.getBytes(StandardCharsets.UTF_8), record.timestamp()),
          "balances");
      context.forward(new Record<>(paymentId, raw, record.timestamp()), "audit");
    }

    private void deadLetter(Record<String, byte[]> record, String message) {
      RecordHeaders headers = new RecordHeaders();
      headers.add("onceflow.error.message", message.getBytes(StandardCharsets.UTF_8));
      RecordMetadata meta = context.recordMetadata().orElseThrow();
      headers.add("onceflow.error.topic", meta.topic().getBytes(StandardCharsets.UTF_8));
      headers.add(
          "onceflow.error.partition",
          Integer.toString(meta.partition()).getBytes(StandardCharsets.UTF_8));
      headers.add(
          "onceflow.error.offset", Long.toString(meta.offset()).getBytes(StandardCharsets.UTF_8));
      headers.add("onceflow.error.processor", applicationId.getBytes(StandardCharsets.UTF_8));
      context.forward(
          new Record<>(record.key(), record.value(), record.timestamp(), headers), "dlq");
    }

    private static String stringField(JsonNode value, String name) throws InvalidPayment {
      JsonNode field = value.get(name);
      if (field == null) {
        throw new InvalidPayment("missing field \"" + name + "\"");
      }
      if (!field.isTextual()) {
        throw new InvalidPayment("field \"" + name + "\" must be a string");
      }
      return field.textValue();
    }
  }

  /** A payment that fails validation; the message is Onceflow's wallet's. */
  static final class InvalidPayment extends Exception {
    InvalidPayment(String reason) {
      super(reason, null, false, false);
    }
  }
}
