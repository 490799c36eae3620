// A small batch job in the shape treadle runs external programs: it reads the run manifest
// (--run-manifest FILE) and, with --source FILE, a source extract (header, rows, "TRAILER|n"),
// writes its staging output and reports into TREADLE_OUTPUT_DIR, and
// ends with an exit code of the standard contract. The run's "scenario" param picks the ending:
//   ok             0   staged; run-output.json becomes the task's result
//   not_ready      20  the source is not there yet (retried)
//   bad_input      30  the input breaks its contract (not retried)
//   commit_unknown 60  the sink did not confirm the commit (waits for `treadle tasks resolve`)
// Single source file, JDK 17, no dependencies: `javac -d classes Snapshot.java`, or run it from
// source with `java Snapshot.java --run-manifest FILE`.

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class Snapshot {
    static final int OK = 0;
    static final int CONFIGURATION_ERROR = 10;
    static final int SOURCE_NOT_READY = 20;
    static final int CONTRACT_VIOLATION = 30;
    static final int UNKNOWN_COMMIT = 60;

    private Snapshot() {}

    public static void main(String[] args) {
        System.exit(run(args));
    }

    static int run(String[] args) {
        String manifestFile = option(args, "--run-manifest");
        String outputDir = System.getenv("TREADLE_OUTPUT_DIR");
        if (manifestFile == null || outputDir == null) {
            System.err.println("snapshot: needs --run-manifest FILE and TREADLE_OUTPUT_DIR");
            return CONFIGURATION_ERROR;
        }
        String manifest;
        try {
            manifest = Files.readString(Path.of(manifestFile), StandardCharsets.UTF_8);
        } catch (IOException e) {
            System.err.println("snapshot: cannot read the run manifest " + manifestFile + ": " + e.getMessage());
            return CONFIGURATION_ERROR;
        }
        String runId = field(manifest, "run_id", "unknown");
        String scenario = field(manifest, "scenario", "ok");
        String trace = System.getenv().getOrDefault("TREADLE_TRACE_ID", "");
        System.out.println("snapshot: run " + runId + " attempt " + System.getenv("TREADLE_ATTEMPT")
                + " scenario " + scenario + " trace " + trace);
        Path out = Path.of(outputDir);
        try {
            switch (scenario) {
                case "not_ready":
                    System.err.println("snapshot: source partition is not published yet");
                    return SOURCE_NOT_READY;
                case "bad_input":
                    write(out.resolve("error-report.json"), "{\"column\": \"amount\", \"problem\": \"negative values\"}");
                    System.err.println("snapshot: contract violation: column amount has negative values");
                    return CONTRACT_VIOLATION;
                default:
                    break;
            }
            String source = option(args, "--source");
            List<String> rows = List.of("region,total", "north,120.5", "south,98.0", "west,43.25");
            if (source != null) {
                try {
                    rows = readSource(Path.of(source));
                } catch (IOException e) {
                    System.err.println("snapshot: cannot read the source " + source + ": " + e.getMessage());
                    return SOURCE_NOT_READY;
                }
            }
            Path staging = out.resolve("staging");
            Files.createDirectories(staging);
            Path part = staging.resolve("part-00000.csv");
            Files.write(part, rows, StandardCharsets.UTF_8);
            int count = rows.size() - 1;
            write(out.resolve("metrics.json"), "{\"rows_written\": " + count + "}");
            write(out.resolve("lineage.json"),
                    "{\"inputs\": [\"warehouse.sales\"], \"outputs\": [\"" + json(part.toString()) + "\"]}");
            if (scenario.equals("commit_unknown")) {
                write(out.resolve("sink-commit.json"), "{\"status\": \"unknown\", \"staging\": \"" + json(part.toString()) + "\"}");
                System.err.println("snapshot: the sink did not confirm the commit; inspect before rerunning");
                return UNKNOWN_COMMIT;
            }
            write(out.resolve("run-output.json"), "{\"rows\": " + count + ", \"staging\": \"" + json(part.toString())
                    + "\", \"run_id\": \"" + json(runId) + "\"}");
            System.out.println("snapshot: staged " + count + " rows at " + part);
            return OK;
        } catch (IOException e) {
            System.err.println("snapshot: cannot write the output: " + e.getMessage());
            return 50; // sink write failed: retryable
        }
    }

    /** The source extract without its trailer line ("TRAILER|n"): header first, then data rows. */
    static List<String> readSource(Path source) throws IOException {
        List<String> rows = new ArrayList<>();
        for (String line : Files.readAllLines(source, StandardCharsets.UTF_8)) {
            if (!line.isBlank() && !line.startsWith("TRAILER|")) {
                rows.add(line);
            }
        }
        return rows;
    }

    static String option(String[] args, String name) {
        for (int i = 0; i + 1 < args.length; i++) {
            if (args[i].equals(name)) {
                return args[i + 1];
            }
        }
        return null;
    }

    /** The first string value of "key" in a JSON text (enough for the flat keys this job reads). */
    static String field(String json, String key, String fallback) {
        Matcher m = Pattern.compile("\"" + Pattern.quote(key) + "\"\\s*:\\s*\"([^\"\\\\]*)\"").matcher(json);
        return m.find() ? m.group(1) : fallback;
    }

    static String json(String text) {
        return text.replace("\\", "\\\\").replace("\"", "\\\"");
    }

    static void write(Path path, String text) throws IOException {
        Files.writeString(path, text + "\n", StandardCharsets.UTF_8);
    }
}
