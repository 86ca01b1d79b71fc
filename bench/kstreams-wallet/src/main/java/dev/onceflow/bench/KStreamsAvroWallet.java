package dev.onceflow.bench;

import io.apicurio.registry.serde.avro.AvroKafkaDeserializer;
import io.apicurio.registry.serde.avro.AvroKafkaSerializer;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.avro.AvroRuntimeException;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
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
 * The wallet on Avro topics (examples/wallet-avro) as a Kafka Streams application: {@link
 * KStreamsWallet}'s topology (Processor API, cached changelogged RocksDB store, balances + audit +
 * dead letters with the {@code onceflow.error.*} headers), with payments read and balances and
 * audit copies written in Avro, in the schema registry's wire format (a 0 byte, a 4-byte
 * big-endian schema id, the Avro binary datum), through Apicurio Registry's Avro serde for Kafka
 * (io.apicurio:apicurio-registry-avro-serde-kafka 3.x, {@link AvroKafkaDeserializer} / {@link
 * AvroKafkaSerializer} of {@link GenericRecord}).
 *
 * <p>Apicurio 3.x serdes write and read that wire format by default: {@code
 * apicurio.registry.id-handler} is {@code Default4ByteIdHandler}, {@code apicurio.registry.use-id}
 * {@code contentId} (the id Apicurio's Confluent API returns for a registered schema, unless its
 * legacy-id mode is on), {@code apicurio.registry.headers.enabled} false (the id in the value, not
 * in headers). Both are set here anyway, so that the choice is visible. The output schemas are
 * registered by the serializer on first use ({@code apicurio.registry.auto-register}) under the
 * artifact {@code <topic>-value} in the default group: the Confluent API's subject {@code
 * <topic>-value}.
 *
 * <p>The payment is deserialized in the processor, not by the source node, so that a value that is
 * not Avro in the wire format (the benchmark's malformed payments are JSON text) is dead-lettered
 * with its coordinates as {@code onceflow verify} expects, as the JSON twin does. A value that is
 * framed but whose datum does not decode, or decodes to a record without the payment's fields, is
 * dead-lettered too. Any error from the registry (unreachable, or a schema id it does not know)
 * fails the stream thread: the serde does not tell the two apart (the benchmark's input has
 * neither).
 *
 * <p>Usage: {@code KStreamsAvroWallet <bootstrap> <application-id> <payments> <balances> <audit>
 * <dlq> <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir> <registry-url>}, the JSON
 * twin's arguments and the registry: its Confluent API as {@code scripts/registry up} prints it
 * ({@code http://HOST:PORT/apis/ccompat/v7}; the serde talks to Apicurio's own API, {@code
 * /apis/registry/v3} on the same server) or Apicurio's v3 API itself. Runs until SIGTERM. {@code
 * KSTREAMS_PROPS} as in {@link KStreamsWallet}; its {@code apicurio.*} pairs go to the serdes.
 */
public final class KStreamsAvroWallet {
  static final String STORE = "balances";

  /** examples/wallet-avro/schemas/balance.avsc. */
  static final Schema BALANCE =
      new Schema.Parser()
          .parse(
              "{\"type\": \"record\", \"name\": \"Balance\", \"namespace\":"
                  + " \"onceflow.examples.wallet\", \"doc\": \"An account's balance after a"
                  + " payment.\", \"fields\": [{\"name\": \"account\", \"type\": \"string\"},"
                  + " {\"name\": \"balance\", \"type\": \"long\"}, {\"name\": \"payment_id\","
                  + " \"type\": \"string\"}]}");

  public static void main(String[] args) throws InterruptedException {
    if (args.length != 10) {
      System.err.println(
          "usage: KStreamsAvroWallet <bootstrap> <application-id> <payments> <balances> <audit>"
              + " <dlq> <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir>"
              + " <registry-url>");
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
    String registry = apicurioUrl(args[9]);

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

    Map<String, Object> serde = new HashMap<>();
    serde.put("apicurio.registry.url", registry);
    serde.put("apicurio.registry.id-handler", "io.apicurio.registry.serde.Default4ByteIdHandler");
    serde.put("apicurio.registry.use-id", "contentId");
    serde.put("apicurio.registry.headers.enabled", "false");
    serde.put("apicurio.registry.auto-register", "true");

    String extra = System.getenv("KSTREAMS_PROPS");
    if (extra != null && !extra.isBlank()) {
      for (String pair : extra.split(",")) {
        int eq = pair.indexOf('=');
        if (eq <= 0) {
          System.err.println("kstreams-avro-wallet: KSTREAMS_PROPS: expected key=value, got: " + pair);
          System.exit(2);
        }
        String key = pair.substring(0, eq).trim();
        String value = pair.substring(eq + 1).trim();
        if (key.startsWith("apicurio.")) {
          serde.put(key, value);
        } else {
          props.put(key, value);
        }
      }
    }

    AvroKafkaSerializer<GenericRecord> balanceSerializer = new AvroKafkaSerializer<>();
    balanceSerializer.configure(serde, false);
    AvroKafkaSerializer<GenericRecord> auditSerializer = new AvroKafkaSerializer<>();
    auditSerializer.configure(serde, false);

    Topology topology = new Topology();
    topology.addSource(
        "payments", Serdes.String().deserializer(), Serdes.ByteArray().deserializer(), payments);
    topology.addProcessor(
        "wallet", () -> new WalletProcessor(applicationId, serde), "payments");
    topology.addStateStore(
        Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.Long())
            .withCachingEnabled(),
        "wallet");
    topology.addSink(
        "balances", balances, Serdes.String().serializer(), anyValue(balanceSerializer), "wallet");
    topology.addSink(
        "audit", audit, Serdes.String().serializer(), anyValue(auditSerializer), "wallet");
    topology.addSink(
        "dlq", dlq, Serdes.String().serializer(), anyValue(Serdes.ByteArray().serializer()), "wallet");

    KafkaStreams streams = new KafkaStreams(topology, props);
    CountDownLatch stopped = new CountDownLatch(1);
    streams.setUncaughtExceptionHandler(
        e -> {
          System.err.println("kstreams-avro-wallet: stream thread failed: " + e);
          stopped.countDown();
          return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
              .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(30));
                  balanceSerializer.close();
                  auditSerializer.close();
                  stopped.countDown();
                }));
    streams.start();
    stopped.await();
  }

  /**
   * Apicurio's own API for the serde: {@code .../apis/ccompat/v7} (or v6), what scripts/registry
   * prints, becomes {@code .../apis/registry/v3}; anything else is taken as it is.
   */
  static String apicurioUrl(String url) {
    String u = url.endsWith("/") ? url.substring(0, url.length() - 1) : url;
    for (String ccompat : new String[] {"/apis/ccompat/v7", "/apis/ccompat/v6"}) {
      if (u.endsWith(ccompat)) {
        return u.substring(0, u.length() - ccompat.length()) + "/apis/registry/v3";
      }
    }
    return u;
  }

  /** The processor forwards balances and audit copies (records) and dead letters (bytes). */
  @SuppressWarnings("unchecked")
  static Serializer<Object> anyValue(Serializer<?> serializer) {
    return (Serializer<Object>) serializer;
  }

  /** One payment in, balance + audit out (or one dead letter). */
  static final class WalletProcessor implements Processor<String, byte[], String, Object> {
    private final String applicationId;
    private final Map<String, Object> serdeConfig;
    private AvroKafkaDeserializer<GenericRecord> deserializer;
    private ProcessorContext<String, Object> context;
    private KeyValueStore<String, Long> store;

    WalletProcessor(String applicationId, Map<String, Object> serdeConfig) {
      this.applicationId = applicationId;
      this.serdeConfig = serdeConfig;
    }

    @Override
    public void init(ProcessorContext<String, Object> context) {
      this.context = context;
      this.store = context.getStateStore(STORE);
      this.deserializer = new AvroKafkaDeserializer<>();
      this.deserializer.configure(serdeConfig, false);
    }

    @Override
    public void close() {
      if (deserializer != null) {
        deserializer.close();
      }
    }

    @Override
    public void process(Record<String, byte[]> record) {
      byte[] raw = record.value();
      GenericRecord payment;
      String paymentId;
      String account;
      long amount;
      try {
        if (raw == null) {
          throw new KStreamsWallet.InvalidPayment("missing value");
        }
        if (raw.length < 5) {
          throw new KStreamsWallet.InvalidPayment(
              raw.length + " bytes: too short for the schema registry's wire format");
        }
        if (raw[0] != 0) {
          throw new KStreamsWallet.InvalidPayment(
              String.format(
                  "not in the schema registry's wire format: the first byte is 0x%02x, not 0",
                  raw[0] & 0xff));
        }
        try {
          payment = deserializer.deserialize(context.recordMetadata().orElseThrow().topic(), raw);
        } catch (AvroRuntimeException
            | UncheckedIOException
            | IndexOutOfBoundsException
            | NegativeArraySizeException e) {
          throw new KStreamsWallet.InvalidPayment("not a valid Avro datum: " + e);
        }
        if (payment == null) {
          throw new KStreamsWallet.InvalidPayment("not an Avro record");
        }
        paymentId = stringField(payment, "payment_id");
        account = stringField(payment, "account");
        Object a = field(payment, "amount");
        if (!(a instanceof Long)) {
          throw new KStreamsWallet.InvalidPayment("field \"amount\" must be a long");
        }
        amount = (Long) a;
      } catch (KStreamsWallet.InvalidPayment e) {
        deadLetter(record, "invalid payment: " + e.getMessage());
        return;
      }
      Long previous = store.get(account);
      long balance;
      try {
        balance = Math.addExact(previous == null ? 0L : previous, amount);
      } catch (ArithmeticException e) {
        deadLetter(record, "invalid payment: balance overflow for account \"" + account + "\"");
        return;
      }
      store.put(account, balance);
      GenericData.Record report = new GenericData.Record(BALANCE);
      report.put("account", account);
      report.put("balance", balance);
      report.put("payment_id", paymentId);
      context.forward(new Record<>(account, report, record.timestamp()), "balances");
      context.forward(new Record<>(paymentId, payment, record.timestamp()), "audit");
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
          new Record<String, Object>(record.key(), record.value(), record.timestamp(), headers),
          "dlq");
    }

    private static Object field(GenericRecord record, String name)
        throws KStreamsWallet.InvalidPayment {
      if (!record.hasField(name)) {
        throw new KStreamsWallet.InvalidPayment("missing field \"" + name + "\"");
      }
      return record.get(name);
    }

    private static String stringField(GenericRecord record, String name)
        throws KStreamsWallet.InvalidPayment {
      Object value = field(record, name);
      if (!(value instanceof CharSequence)) {
        throw new KStreamsWallet.InvalidPayment("field \"" + name + "\" must be a string");
      }
      return value.toString();
    }
  }

  private KStreamsAvroWallet() {}
}
