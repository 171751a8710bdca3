package dev.backstop.bench;

import dev.backstop.Failure;
import dev.backstop.Policy;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;

/**
 * RetryBench's three backstop workloads (decide of a 503 on a GET, decide of
 * a timeout, decideMany of 256) timed by this thread's CPU time, not the
 * wall clock: on a shared, loaded machine JMH's average time mostly
 * measures the other processes (BENCHMARKS.md, issue 41). It uses only the
 * public API, so the same file runs against any build of backstop-policy:
 *
 * <pre>
 * javac -cp JAR -d /tmp/cpubench-X CpuBench.java   # JAR: a benchmarks.jar (bench/java)
 * java -cp JAR:/tmp/cpubench-X dev.backstop.bench.CpuBench [rounds]
 * </pre>
 *
 * Warms up for 3 s of CPU time, then prints the median ns per decision of
 * each workload over the rounds (default 11).
 */
public final class CpuBench {
  private static volatile long sink;

  private CpuBench() {}

  public static void main(String[] args) {
    int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 11;
    ThreadMXBean mx = ManagementFactory.getThreadMXBean();
    try (Policy p = Policy.preset("default")) {
      Failure f503 = Failure.builder().attempt(3).httpStatus(503).method("GET").elapsedMs(1200)
          .nowMs(1_767_225_600_000L).random(0.37).build();
      Failure timeout = Failure.builder().attempt(2).errorKind("timeout").elapsedMs(300)
          .nowMs(1_767_225_600_000L).random(0.37).build();
      List<Failure> batch = Collections.nCopies(256, f503);
      Runnable[] work = {
        () -> sink += p.decide(f503).delayMs(),
        () -> sink += p.decide(timeout).delayMs(),
        () -> sink += p.decideMany(batch).size(),
      };
      int[] perRound = {10_000, 10_000, 40};
      int[] perOp = {1, 1, 256};
      long warm = mx.getCurrentThreadCpuTime() + 3_000_000_000L;
      while (mx.getCurrentThreadCpuTime() < warm) {
        for (int w = 0; w < work.length; w++) {
          for (int i = 0; i < perRound[w] / 10; i++) work[w].run();
        }
      }
      double[][] ns = new double[work.length][rounds];
      for (int r = 0; r < rounds; r++) {
        for (int w = 0; w < work.length; w++) {
          long t0 = mx.getCurrentThreadCpuTime();
          for (int i = 0; i < perRound[w]; i++) work[w].run();
          ns[w][r] = (mx.getCurrentThreadCpuTime() - t0) / (double) (perRound[w] * perOp[w]);
        }
      }
      String[] names = {"decide503", "decideTimeout", "decideMany"};
      StringBuilder out = new StringBuilder("cpubench");
      for (int w = 0; w < work.length; w++) {
        Arrays.sort(ns[w]);
        out.append(String.format(" %s=%.1f", names[w], ns[w][rounds / 2]));
      }
      System.out.println(out);
    }
  }
}
