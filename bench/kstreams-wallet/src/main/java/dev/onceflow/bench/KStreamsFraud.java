package dev.onceflow.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Onceflow fraud check written as a Kafka Streams application (DSL): payments (a stream keyed by
 * account id) inner-joined with accounts (a compacted topic read as a KTable; a tombstone deletes
 * the account). A joined payment to a blocked account raises a "blocked" alert; otherwise one whose
 * amount exceeds the account's limit raises an "over-limit" alert; anything else, and any payment
 * whose account is absent, produces nothing. Payments (or accounts) that are not valid JSON or lack
 * a field are dropped, logged at debug.
 *
 * <p>Output: key = the account id, value = {@code
 * {"payment_id":"p1","account":"alice","amount":250,"limit":200,"reason":"over-limit"}}.
 *
 * <p>Usage: {@code KStreamsFraud <bootstrap> <application-id> <payments-topic> <accounts-topic>
 * <alerts-topic> <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir>}. Prints one line
 * to stdout on first reaching RUNNING; runs until SIGTERM.
 */
public final class KStreamsFraud {
  static final String STORE = "accounts";
  private static final Logger LOG = LoggerFactory.getLogger(KStreamsFraud.class);
  private static final ObjectMapper JSON = new ObjectMapper();

  public static void main(String[] args) throws InterruptedException {
    if (args.length != 8) {
      System.err.println(
          "usage: KStreamsFraud <bootstrap> <application-id> <payments-topic> <accounts-topic>"
              + " <alerts-topic> <exactly_once_v2|at_least_once> <commit-interval-ms> <state-dir>");
      System.exit(2);
    }
    String bootstrap = args[0];
    String applicationId = args[1];
    String payments = args[2];
    String accounts = args[3];
    String alerts = args[4];
    String guarantee = args[5];
    String commitIntervalMs = args[6];
    String stateDir = args[7];

    Topology topology = topology(payments, accounts, alerts);
    Properties props =
        KStreamsPageviews.properties(
            bootstrap, applicationId, guarantee, commitIntervalMs, stateDir);
    KStreamsPageviews.run("kstreams-fraud", topology, props);
  }

  static Topology topology(String payments, String accounts, String alerts) {
    StreamsBuilder builder = new StreamsBuilder();
    KTable<String, byte[]> accountTable =
        builder.table(
            accounts,
            Consumed.with(Serdes.String(), Serdes.ByteArray()),
            Materialized.<String, byte[], KeyValueStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.ByteArray()));
    builder.stream(payments, Consumed.with(Serdes.String(), Serdes.ByteArray()))
        .join(
            accountTable,
            KStreamsFraud::check,
            Joined.with(Serdes.String(), Serdes.ByteArray(), Serdes.ByteArray()))
        .filter((account, alert) -> alert != null)
        .to(alerts, Produced.with(Serdes.String(), Serdes.String()));
    return builder.build();
  }

  /** The alert for one joined payment, or null for none (or for a malformed input). */
  static String check(byte[] paymentRaw, byte[] accountRaw) {
    String paymentId;
    String account;
    long amount;
    try {
      JsonNode payment = object(paymentRaw);
      paymentId = string(payment, "payment_id");
      account = string(payment, "account");
      amount = integer(payment, "amount");
    } catch (Invalid e) {
      LOG.debug("dropping payment: {}", e.getMessage());
      return null;
    }
    String status;
    long limit;
    try {
      JsonNode acct = object(accountRaw);
      limit = integer(acct, "limit");
      status = string(acct, "status");
    } catch (Invalid e) {
      LOG.debug("dropping payment {}: account {}", paymentId, e.getMessage());
      return null;
    }
    String reason;
    if (status.equals("blocked")) {
      reason = "blocked";
    } else if (amount > limit) {
      reason = "over-limit";
    } else {
      return null;
    }
    StringBuilder json = new StringBuilder(112);
    json.append("{\"payment_id\":");
    KStreamsPageviews.Json.string(json, paymentId);
    json.append(",\"account\":");
    KStreamsPageviews.Json.string(json, account);
    json.append(",\"amount\":").append(amount);
    json.append(",\"limit\":").append(limit);
    json.append(",\"reason\":");
    KStreamsPageviews.Json.string(json, reason);
    return json.append('}').toString();
  }

  private static JsonNode object(byte[] raw) throws Invalid {
    if (raw == null) {
      throw new Invalid("missing value");
    }
    JsonNode value;
    try {
      value = JSON.readTree(raw);
    } catch (IOException e) {
      throw new Invalid("not valid JSON");
    }
    if (value == null || !value.isObject()) {
      throw new Invalid("not a JSON object");
    }
    return value;
  }

  private static String string(JsonNode value, String name) throws Invalid {
    JsonNode field = value.get(name);
    if (field == null || !field.isTextual()) {
      throw new Invalid("field \"" + name + "\" missing or not a string");
    }
    return field.textValue();
  }

  private static long integer(JsonNode value, String name) throws Invalid {
    JsonNode field = value.get(name);
    if (field == null || !field.isIntegralNumber() || !field.canConvertToLong()) {
      throw new Invalid("field \"" + name + "\" missing or not an integer");
    }
    return field.longValue();
  }

  /** A malformed payment or account value. */
  static final class Invalid extends Exception {
    Invalid(String reason) {
      super(reason, null, false, false);
    }
  }
}
