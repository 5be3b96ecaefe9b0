package bench.peers;

import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;

/**
 * Debezium's Vitess connector in the embedded engine, counting change records until a given
 * number has arrived; the Debezium side of bench/bench_peers.py.
 *
 * <p>Arguments: a properties file (the connector's configuration, written by the bench script:
 * vtgate address and credentials, keyspace, shard, table, snapshot mode, start VGTID), the
 * number of data change records to wait for, and the consumer: {@code json} serializes each
 * record's value with Kafka Connect's {@link JsonConverter} (schemas included, its default: the
 * least a Kafka deployment pays for every record), {@code count} only counts. Offsets live in
 * Kafka Connect's in-memory store, so every run starts from the configuration.
 *
 * <p>Prints one JSON line: records, seconds and this JVM's CPU seconds from the engine's start to
 * the last expected record, the seconds to the first record, the serialized bytes, records per {@code op}, and the JVM's peak RSS
 * (VmHWM), read before the engine is stopped.
 */
public final class DebeziumPeer {

    private DebeziumPeer() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3 || !(args[2].equals("json") || args[2].equals("count"))) {
            System.err.println("usage: DebeziumPeer CONFIG.properties EXPECTED_RECORDS json|count");
            System.exit(2);
        }
        Properties props = new Properties();
        try (var in = Files.newInputStream(Path.of(args[0]))) {
            props.load(in);
        }
        long expected = Long.parseLong(args[1]);
        boolean serialize = args[2].equals("json");

        JsonConverter converter = new JsonConverter();
        converter.configure(Map.of("schemas.enable", "true"), false);

        CountDownLatch done = new CountDownLatch(1);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        // Written by the engine's consumer thread only (the notifying consumer gets batches one
        // at a time); read after the latch, which orders the writes before the reads.
        long[] counted = {0, 0, 0}; // records, JSON bytes, other records (schema changes, ...)
        long[] firstNanos = {0};
        long[] endNanos = {0};
        Map<String, Long> ops = new TreeMap<>();

        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(props)
                .notifying((List<RecordChangeEvent<SourceRecord>> records,
                        DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer) -> {
                    for (RecordChangeEvent<SourceRecord> event : records) {
                        SourceRecord record = event.record();
                        String op = op(record);
                        if (op == null) {
                            counted[2]++;
                        }
                        else {
                            if (serialize) {
                                byte[] bytes = converter.fromConnectData(record.topic(), record.valueSchema(), record.value());
                                counted[1] += bytes.length;
                            }
                            ops.merge(op, 1L, Long::sum);
                            if (counted[0] == 0) {
                                firstNanos[0] = System.nanoTime();
                            }
                            if (++counted[0] == expected) {
                                endNanos[0] = System.nanoTime();
                                done.countDown();
                            }
                        }
                        committer.markProcessed(event);
                    }
                    committer.markBatchFinished();
                })
                .using((boolean success, String message, Throwable error) -> {
                    if (done.getCount() > 0) {
                        failure.set(error != null ? error : new IllegalStateException("engine stopped: " + message));
                        done.countDown();
                    }
                })
                .build();

        long startCpu = processCpuNanos();
        long startNanos = System.nanoTime();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        done.await();
        long cpu = processCpuNanos() - startCpu;
        long peakRss = statusKib("VmHWM");
        if (failure.get() != null) {
            System.err.println("the Debezium engine stopped after " + counted[0] + " of " + expected + " records");
            failure.get().printStackTrace();
            System.exit(1);
        }
        double seconds = (endNanos[0] - startNanos) / 1e9;
        double firstRecordSeconds = (firstNanos[0] - startNanos) / 1e9;
        StringBuilder opsJson = new StringBuilder("{");
        ops.forEach((k, v) -> opsJson.append(opsJson.length() > 1 ? "," : "").append('"').append(k).append("\":").append(v));
        opsJson.append('}');
        System.out.println("{\"records\":" + counted[0] + ",\"seconds\":" + seconds + ",\"first_record_seconds\":" + firstRecordSeconds + ",\"cpu_seconds\":" + cpu / 1e9
                + ",\"json_bytes\":" + counted[1] + ",\"other_records\":" + counted[2] + ",\"ops\":" + opsJson
                + ",\"peak_rss_kib\":" + peakRss + ",\"max_heap_bytes\":" + Runtime.getRuntime().maxMemory()
                + ",\"processors\":" + Runtime.getRuntime().availableProcessors() + "}");
        System.out.flush();
        // The figures are out; a stuck shutdown of the gRPC stream must not hang the bench.
        Thread closer = new Thread(() -> {
            try {
                engine.close();
            }
            catch (Exception e) {
                // the process exits below anyway
            }
        });
        closer.setDaemon(true);
        closer.start();
        closer.join(TimeUnit.SECONDS.toMillis(10));
        executor.shutdownNow();
        System.exit(0);
    }

    /** The record's Debezium {@code op} (c, u, d, r), or null for records without one. */
    private static String op(SourceRecord record) {
        if (!(record.value() instanceof Struct value) || value.schema().field("op") == null) {
            return null;
        }
        return value.getString("op");
    }

    private static long processCpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    private static long statusKib(String field) throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith(field + ":")) {
                return Long.parseLong(line.split("\\s+")[1]);
            }
        }
        return -1;
    }
}
