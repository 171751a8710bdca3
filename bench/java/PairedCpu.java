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

/**
 * Two builds of backstop-policy side by side in one JVM (each benchmarks.jar
 * in a class loader of its own), RetryBench's backstop workloads run on
 * each in turn, the order swapped every round, timed by this thread's CPU
 * time: both builds see the same load, so the per-round ratio after ÷ before
 * holds where separate processes on a shared machine do not (BENCHMARKS.md,
 * issue 41). Uses only the public API, by reflection:
 *
 * <pre>
 * java bench/java/PairedCpu.java BEFORE.jar AFTER.jar [rounds]
 * </pre>
 */
public final class PairedCpu {
  static volatile Object sink;

  /** The three workloads of one build: decide a 503 on a GET, decide a timeout, decideMany of 256. */
  static MethodHandle[] workloads(String jar) throws Throwable {
    ClassLoader cl = new URLClassLoader(new URL[] {Path.of(jar).toUri().toURL()}, ClassLoader.getPlatformClassLoader());
    Class<?> policyC = cl.loadClass("dev.backstop.Policy");
    Class<?> failureC = cl.loadClass("dev.backstop.Failure");
    Object policy = policyC.getMethod("preset", String.class).invoke(null, "default");
    Object f503 = build(failureC, "httpStatus", 503, 3, 1200);
    Object timeout = build(failureC, "errorKind", "timeout", 2, 300);
    MethodHandles.Lookup l = MethodHandles.publicLookup();
    MethodHandle decide = l.findVirtual(policyC, "decide", MethodType.methodType(cl.loadClass("dev.backstop.Decision"), failureC))
        .bindTo(policy).asType(MethodType.methodType(Object.class, Object.class));
    MethodHandle many = l.findVirtual(policyC, "decideMany", MethodType.methodType(List.class, List.class))
        .bindTo(policy).asType(MethodType.methodType(Object.class, Object.class));
    return new MethodHandle[] {
      MethodHandles.insertArguments(decide, 0, f503),
      MethodHandles.insertArguments(decide, 0, timeout),
      MethodHandles.insertArguments(many, 0, Collections.nCopies(256, f503)),
    };
  }

  static Object build(Class<?> failureC, String what, Object v, long attempt, long elapsed) throws Throwable {
    Object b = failureC.getMethod("builder").invoke(null);
    Class<?> bc = b.getClass();
    b = bc.getMethod("attempt", long.class).invoke(b, attempt);
    if (v instanceof Integer) {
      b = bc.getMethod(what, int.class).invoke(b, v);
      b = bc.getMethod("method", String.class).invoke(b, "GET");
    } else {
      b = bc.getMethod(what, String.class).invoke(b, v);
    }
    b = bc.getMethod("elapsedMs", long.class).invoke(b, elapsed);
    b = bc.getMethod("nowMs", long.class).invoke(b, 1_767_225_600_000L);
    b = bc.getMethod("random", double.class).invoke(b, 0.37);
    return bc.getMethod("build").invoke(b);
  }

  static double time(ThreadMXBean mx, MethodHandle op, int n, int perOp) throws Throwable {
    long t0 = mx.getCurrentThreadCpuTime();
    for (int i = 0; i < n; i++) sink = (Object) op.invokeExact();
    return (mx.getCurrentThreadCpuTime() - t0) / (double) (n * perOp);
  }

  public static void main(String[] args) throws Throwable {
    int rounds = args.length > 2 ? Integer.parseInt(args[2]) : 31;
    MethodHandle[][] w = {workloads(args[0]), workloads(args[1])};
    String[] names = {"decide 503", "decide timeout", "decideMany, per decision"};
    int[] n = {5_000, 5_000, 20};
    int[] perOp = {1, 1, 256};
    ThreadMXBean mx = ManagementFactory.getThreadMXBean();
    long warm = mx.getCurrentThreadCpuTime() + 6_000_000_000L;
    while (mx.getCurrentThreadCpuTime() < warm) {
      for (int k = 0; k < 3; k++) for (int s = 0; s < 2; s++) time(mx, w[s][k], n[k] / 5, perOp[k]);
    }
    double[][][] ns = new double[3][2][rounds];
    for (int r = 0; r < rounds; r++) {
      for (int k = 0; k < 3; k++) {
        for (int j = 0; j < 2; j++) {
          int s = (r + j) % 2; // before first in even rounds, after first in odd ones
          ns[k][s][r] = time(mx, w[s][k], n[k], perOp[k]);
        }
      }
    }
    System.out.println("| workload | before, median (best) | after, median (best) | after ÷ before: median of " + rounds
        + " paired ratios (IQR; range) | slower in |");
    for (int k = 0; k < 3; k++) {
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
