import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;

/**
 * PairedCpu's method (both builds of backstop-policy in one JVM, each in a
 * class loader of its own, run in turn, the order swapped every round,
 * timed by this thread's CPU time) over the two paths of a failure
 * (issue 41, "the core reads a failure value"): a typed Failure and a map
 * of plain values (the fast path), and maps the fast path does not take,
 * which the module reads (decide_value): one invalid, one valid. Each build
 * is a class path: the jar and Chicory's runtime, wasm and compiler jars.
 *
 * <pre>
 * D=~/.m2/repository/com/dylibso/chicory; V=1.6.1
 * DEPS=$D/runtime/$V/runtime-$V.jar:$D/wasm/$V/wasm-$V.jar:$D/compiler/$V/compiler-$V.jar
 * java bench/java/PairedValue.java BEFORE.jar:$DEPS AFTER.jar:$DEPS [rounds [workloads]]
 * </pre>
 *
 * workloads: how many of the table's rows to run (3: a build whose module
 * has no decide_value).
 */
public final class PairedValue {
  static volatile Object sink;

  /** The workloads of the build on class path cp, in the order of main's names. */
  static MethodHandle[] workloads(String cp) throws Throwable {
    String[] parts = cp.split(":");
    URL[] urls = new URL[parts.length];
    for (int i = 0; i < parts.length; i++) urls[i] = Path.of(parts[i]).toUri().toURL();
    ClassLoader cl = new URLClassLoader(urls, ClassLoader.getPlatformClassLoader());
    Class<?> policyC = cl.loadClass("dev.backstop.Policy");
    Class<?> failureC = cl.loadClass("dev.backstop.Failure");
    Object policy = policyC.getMethod("preset", String.class).invoke(null, "default");
    Object b = failureC.getMethod("builder").invoke(null);
    Class<?> bc = b.getClass();
    b = bc.getMethod("attempt", long.class).invoke(b, 3L);
    b = bc.getMethod("httpStatus", int.class).invoke(b, 503);
    b = bc.getMethod("method", String.class).invoke(b, "GET");
    b = bc.getMethod("elapsedMs", long.class).invoke(b, 1200L);
    b = bc.getMethod("nowMs", long.class).invoke(b, 1_767_225_600_000L);
    b = bc.getMethod("random", double.class).invoke(b, 0.37);
    Object f503 = bc.getMethod("build").invoke(b);
    MethodHandles.Lookup l = MethodHandles.publicLookup();
    MethodHandle decide = l.findVirtual(policyC, "decide", MethodType.methodType(cl.loadClass("dev.backstop.Decision"), failureC))
        .bindTo(policy);
    MethodHandle fromMap = l.findStatic(failureC, "fromMap", MethodType.methodType(failureC, Map.class));
    MethodHandle mapDecide = MethodHandles.filterArguments(decide, 0, fromMap); // decide(fromMap(m))
    Class<? extends Throwable> inputE = cl.loadClass("dev.backstop.InputException").asSubclass(Throwable.class);
    MethodHandle caught = MethodHandles.dropArguments(MethodHandles.constant(Object.class, "invalid"), 0, inputE, Map.class);
    MethodHandle mapTry = MethodHandles.catchException(mapDecide.asType(MethodType.methodType(Object.class, Map.class)), inputE, caught);
    Map<String, Object> valid = Map.of("attempt", 3L, "http_status", 503L, "method", "GET", "elapsed_ms", 1200L,
        "now_ms", 1_767_225_600_000L, "random", 0.37);
    Map<String, Object> invalid = Map.of("attempt", 3L, "http_status", 1.5, "now_ms", 1_767_225_600_000L, "random", 0.37);
    Map<String, Object> odd = Map.of("attempt", 3L, "http_status", 503L, "grpc_retry_pushback_ms", 1.5, "now_ms", 1_767_225_600_000L, "random", 0.37);
    MethodHandle many = l.findVirtual(policyC, "decideMany", MethodType.methodType(List.class, List.class))
        .bindTo(policy).asType(MethodType.methodType(Object.class, Object.class));
    return new MethodHandle[] {
      MethodHandles.insertArguments(decide.asType(MethodType.methodType(Object.class, Object.class)), 0, f503),
      MethodHandles.insertArguments(many, 0, Collections.nCopies(256, f503)),
      MethodHandles.insertArguments(mapTry, 0, valid),
      MethodHandles.insertArguments(mapTry, 0, invalid),
      MethodHandles.insertArguments(mapTry, 0, odd),
    };
  }

  /** CPU ns per decision of n ops of perOp decisions each. */
  static double time(ThreadMXBean mx, MethodHandle op, int n, int perOp) throws Throwable {
    long t0 = mx.getCurrentThreadCpuTime();
    for (int i = 0; i < n; i++) sink = (Object) op.invokeExact();
    return (mx.getCurrentThreadCpuTime() - t0) / (double) (n * perOp);
  }

  public static void main(String[] args) throws Throwable {
    int rounds = args.length > 2 ? Integer.parseInt(args[2]) : 31;
    MethodHandle[][] w = {workloads(args[0]), workloads(args[1])};
    String[] names = {"decide, a typed 503", "decideMany of 256 typed, per decision", "fromMap + decide, a map of plain values",
        "fromMap + decide, an invalid map (http_status 1.5)", "fromMap + decide, a valid map the fast path does not take (pushback 1.5)"};
    int k2 = args.length > 3 ? Integer.parseInt(args[3]) : names.length;
    int n = 3_000;
    int[] per = {1, 256, 1, 1, 1}; // decisions per op
    ThreadMXBean mx = ManagementFactory.getThreadMXBean();
    long warm = mx.getCurrentThreadCpuTime() + 8_000_000_000L;
    while (mx.getCurrentThreadCpuTime() < warm) {
      for (int k = 0; k < k2; k++) for (int s = 0; s < 2; s++) time(mx, w[s][k], n / 5 / (per[k] == 1 ? 1 : 100), per[k]);
    }
    double[][][] ns = new double[k2][2][rounds];
    for (int r = 0; r < rounds; r++) {
      for (int k = 0; k < k2; k++) {
        for (int j = 0; j < 2; j++) {
          int s = (r + j) % 2;
          ns[k][s][r] = time(mx, w[s][k], per[k] == 1 ? n : 20, per[k]);
        }
      }
    }
    System.out.println("| workload | before, median (best) | after, median (best) | after ÷ before: median of " + rounds
        + " paired ratios (IQR; range) | slower in |");
    for (int k = 0; k < k2; k++) {
      double[] ratio = new double[rounds];
      int slower = 0;
      for (int r = 0; r < rounds; r++) {
        ratio[r] = ns[k][1][r] / ns[k][0][r];
        if (ratio[r] > 1) slower++;
      }
      Arrays.sort(ratio);
      double[] b = ns[k][0].clone();
      double[] a = ns[k][1].clone();
      Arrays.sort(b);
      Arrays.sort(a);
      System.out.printf("| %s | %.0f (%.0f) ns | %.0f (%.0f) ns | %.3f (%.3f–%.3f; %.2f–%.2f) | %d of %d |%n", names[k],
          b[rounds / 2], b[0], a[rounds / 2], a[0], ratio[rounds / 2], ratio[rounds / 4], ratio[3 * rounds / 4],
          ratio[0], ratio[rounds - 1], slower, rounds);
    }
  }
}
