// A small Java client of Fortis, written against the stubs that `buf generate` (with
// protos/buf.gen.java.yaml) writes from the one copy of the contracts: it submits a test plan
// (CreateEvaluation), follows it (WatchEvaluation) until it ends, and downloads the report
// (GetEvaluationReport) into a folder. Build and run: clients/java/README.md.
//
//   java FortisExample --address HOST:PORT --api-key KEY --out DIR PLAN.yaml
//
// Progress goes to stderr, one line per change; the last line on stdout is a JSON summary.
// Exit status: 0 succeeded; 1 failed, cancelled or refused by the server (e.g. a wrong key);
// 2 bad input: bad usage, an unreadable plan, or the server's INVALID_ARGUMENT, printed with
// every field violation of its google.rpc.BadRequest detail.
import ai.fortis.evaluation.v1.CreateEvaluationRequest;
import ai.fortis.evaluation.v1.Evaluation;
import ai.fortis.evaluation.v1.EvaluationServiceGrpc;
import ai.fortis.evaluation.v1.EvaluationState;
import ai.fortis.evaluation.v1.GetEvaluationReportRequest;
import ai.fortis.evaluation.v1.GetEvaluationReportResponse;
import ai.fortis.evaluation.v1.GetEvaluationRequest;
import ai.fortis.evaluation.v1.PlanFormat;
import ai.fortis.evaluation.v1.Progress;
import ai.fortis.evaluation.v1.WatchEvaluationRequest;
import ai.fortis.evaluation.v1.WatchEvaluationResponse;
import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.BadRequest;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.MetadataUtils;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Iterator;
import java.util.concurrent.TimeUnit;

public final class FortisExample {
  private static final Metadata.Key<String> API_KEY =
      Metadata.Key.of("x-api-key", Metadata.ASCII_STRING_MARSHALLER);
  // A dropped stream is re-opened: the evaluation runs on the server whether or not anyone
  // watches, so losing the stream loses nothing but the lines printed in between.
  private static final int MAX_REWATCHES = 5;

  private FortisExample() {}

  /** Bad usage or an unreadable plan: exit 2 with the message. */
  private static final class UsageError extends Exception {
    UsageError(String message) {
      super(message);
    }
  }

  public static void main(String[] args) {
    String address = System.getenv().getOrDefault("FORTIS_ADDRESS", "127.0.0.1:50051");
    String apiKey = System.getenv("FORTIS_API_KEY");
    String out = "out";
    String planFile = null;
    try {
      for (int i = 0; i < args.length; i++) {
        switch (args[i]) {
          case "--address": address = value(args, ++i); break;
          case "--api-key": apiKey = value(args, ++i); break;
          case "--out": out = value(args, ++i); break;
          default:
            if (args[i].startsWith("--") || planFile != null) {
              throw new UsageError("unexpected argument " + args[i]);
            }
            planFile = args[i];
        }
      }
      if (planFile == null) {
        throw new UsageError(
            "usage: FortisExample [--address HOST:PORT] [--api-key KEY] [--out DIR] PLAN");
      }
      if (apiKey == null || apiKey.isEmpty()) {
        throw new UsageError("no API key: pass --api-key or set FORTIS_API_KEY");
      }
      String plan = readPlan(planFile);
      System.exit(run(address, apiKey, plan, formatOf(planFile), Paths.get(out)));
    } catch (UsageError e) {
      System.err.println("fortis: " + e.getMessage());
      System.exit(2);
    }
  }

  private static String value(String[] args, int i) throws UsageError {
    if (i >= args.length) {
      throw new UsageError(args[i - 1] + " needs a value");
    }
    return args[i];
  }

  private static String readPlan(String file) throws UsageError {
    try {
      return new String(Files.readAllBytes(Paths.get(file)), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UsageError("cannot read the plan " + file + ": " + e);
    }
  }

  private static PlanFormat formatOf(String file) {
    return file.endsWith(".json") ? PlanFormat.PLAN_FORMAT_JSON : PlanFormat.PLAN_FORMAT_YAML;
  }

  static int run(String address, String apiKey, String plan, PlanFormat format, Path out) {
    Metadata headers = new Metadata();
    headers.put(API_KEY, apiKey);
    // Plaintext for a loopback or private-network server; useTransportSecurity() for TLS.
    ManagedChannel channel = ManagedChannelBuilder.forTarget(address)
        .usePlaintext()
        .intercept(MetadataUtils.newAttachHeadersInterceptor(headers))  // every call
        .maxInboundMessageSize(64 * 1024 * 1024)                          // reports can be large
        .build();
    try {
      EvaluationServiceGrpc.EvaluationServiceBlockingStub stub =
          EvaluationServiceGrpc.newBlockingStub(channel);
      Evaluation ev = stub.withDeadlineAfter(60, TimeUnit.SECONDS)
          .createEvaluation(CreateEvaluationRequest.newBuilder()
              .setPlan(plan).setFormat(format).build())
          .getEvaluation();
      String id = ev.getEvaluationId();
      System.err.println("Evaluation " + id + " submitted (plan '" + ev.getPlanName() + "')");
      Evaluation last = watch(stub, id);
      if (last.getState() == EvaluationState.EVALUATION_STATE_SUCCEEDED) {
        GetEvaluationReportResponse report = stub.withDeadlineAfter(300, TimeUnit.SECONDS)
            .getEvaluationReport(GetEvaluationReportRequest.newBuilder()
                .setEvaluationId(id).build());
        Files.createDirectories(out);
        Path json = out.resolve("report.json");
        Files.write(json, report.getReportJson().getBytes(StandardCharsets.UTF_8));
        Files.write(out.resolve("report.html"),
            report.getReportHtml().getBytes(StandardCharsets.UTF_8));
        System.out.println(summary(last, json.toString()));
        return 0;
      }
      System.err.println("fortis: evaluation " + id + " ended " + stateName(last.getState())
          + (last.hasError() ? ": " + last.getError().getMessage() : ""));
      System.out.println(summary(last, null));
      return 1;
    } catch (StatusRuntimeException e) {
      return refused(e);
    } catch (IOException e) {
      System.err.println("fortis: cannot write the report into " + out + ": " + e);
      return 1;
    } finally {
      channel.shutdownNow();
    }
  }

  /** Follows WatchEvaluation to a terminal state; returns the last Evaluation seen. */
  private static Evaluation watch(EvaluationServiceGrpc.EvaluationServiceBlockingStub stub,
                                  String id) {
    WatchEvaluationRequest req = WatchEvaluationRequest.newBuilder().setEvaluationId(id).build();
    Evaluation last = null;
    String lastLine = null;
    for (int attempt = 0; ; attempt++) {
      try {
        Iterator<WatchEvaluationResponse> stream = stub.watchEvaluation(req);
        while (stream.hasNext()) {
          WatchEvaluationResponse r = stream.next();
          if (r.getHeartbeat() || !r.hasEvaluation()) {
            continue;       // keeps idle connections open; nothing changed
          }
          last = r.getEvaluation();
          String line = progressLine(last.getProgress());
          if (!line.equals(lastLine)) {
            System.err.println(line);
            lastLine = line;
          }
          if (terminal(last.getState())) {
            return last;
          }
        }
      } catch (StatusRuntimeException e) {
        if (e.getStatus().getCode() != Status.Code.UNAVAILABLE || attempt >= MAX_REWATCHES) {
          throw e;
        }
      }
      // The stream ended (or dropped) before a terminal state: ask once, then watch again.
      last = stub.withDeadlineAfter(60, TimeUnit.SECONDS)
          .getEvaluation(GetEvaluationRequest.newBuilder().setEvaluationId(id).build())
          .getEvaluation();
      if (terminal(last.getState())) {
        return last;
      }
      if (attempt >= MAX_REWATCHES) {
        throw Status.UNAVAILABLE.withDescription("the watch stream kept ending early")
            .asRuntimeException();
      }
    }
  }

  private static boolean terminal(EvaluationState s) {
    return s == EvaluationState.EVALUATION_STATE_SUCCEEDED
        || s == EvaluationState.EVALUATION_STATE_FAILED
        || s == EvaluationState.EVALUATION_STATE_CANCELLED;
  }

  private static String stateName(EvaluationState s) {
    return s.name().replaceFirst("^EVALUATION_STATE_", "");
  }

  private static String progressLine(Progress p) {
    String stage = p.getStage().name().replaceFirst("^STAGE_", "").toLowerCase();
    return "[" + stage + "] " + p.getItemsDone() + "/" + p.getItemsTotal() + " items, "
        + p.getQueries() + " queries" + (p.getMessage().isEmpty() ? "" : " (" + p.getMessage() + ")");
  }

  /**
   * A refused call: its code and message, and for INVALID_ARGUMENT each field violation of the
   * google.rpc.BadRequest that the server puts in the grpc-status-details-bin trailer (decoded
   * by StatusProto into the generated com.google.rpc.Status).
   */
  private static int refused(StatusRuntimeException e) {
    Status.Code code = e.getStatus().getCode();
    if (code != Status.Code.INVALID_ARGUMENT) {
      System.err.println("fortis: " + code + ": " + e.getStatus().getDescription());
      return 1;
    }
    System.err.println("fortis: the plan is invalid (INVALID_ARGUMENT):");
    int named = 0;
    com.google.rpc.Status detail = StatusProto.fromThrowable(e);
    if (detail != null) {
      for (Any any : detail.getDetailsList()) {
        if (!any.is(BadRequest.class)) {
          continue;
        }
        try {
          for (BadRequest.FieldViolation v : any.unpack(BadRequest.class).getFieldViolationsList()) {
            System.err.println("  " + v.getField() + ": " + v.getDescription());
            named++;
          }
        } catch (InvalidProtocolBufferException bad) {
          System.err.println("  (an undecodable BadRequest detail: " + bad.getMessage() + ")");
        }
      }
    }
    if (named == 0) {
      System.err.println("  " + e.getStatus().getDescription());   // no field named: the message
    }
    return 2;
  }

  private static String summary(Evaluation ev, String reportJson) {
    StringBuilder s = new StringBuilder("{\"evaluation_id\": ").append(quote(ev.getEvaluationId()))
        .append(", \"state\": ").append(quote(stateName(ev.getState())))
        .append(", \"queries\": ").append(ev.getProgress().getQueries())
        .append(", \"report_json\": ").append(reportJson == null ? "null" : quote(reportJson));
    return s.append('}').toString();
  }

  /** A JSON string literal (java.* has no JSON writer; protobuf-util's needs gson). */
  private static String quote(String v) {
    StringBuilder s = new StringBuilder("\"");
    for (char c : v.toCharArray()) {
      if (c == '"' || c == '\\') {
        s.append('\\').append(c);
      } else if (c < 0x20) {
        s.append(String.format("\\u%04x", (int) c));
      } else {
        s.append(c);
      }
    }
    return s.append('"').toString();
  }
}
