package dev.backstop.bench;

import dev.backstop.Decision;
import dev.backstop.Failure;
import dev.backstop.Policy;
import dev.backstop.PolicyRuntime;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.Warmup;

/**
 * The first decision of a process: load backstop.wasm (parse and compile
 * it, or not), start the Go runtime inside, load a preset, decide. One shot per
 * fresh JVM (the parsed module is cached for the process), JVM start-up
 * itself not counted.
 */
@BenchmarkMode(Mode.SingleShotTime)
@OutputTimeUnit(TimeUnit.MILLISECONDS)
@Warmup(iterations = 0)
@Measurement(iterations = 1)
@Fork(5)
@State(Scope.Benchmark)
public class StartBench {
  /**
   * build-time: the bundled module, compiled when the jar was built (the
   * default); runtime: the same bytes given to wasm(), compiled by Chicory's
   * runtime compiler; interpreter: compiled(false).
   */
  @Param({"build-time", "runtime", "interpreter"})
  public String mode;

  @Benchmark
  public Decision firstDecision() throws Exception {
    PolicyRuntime.Builder b = PolicyRuntime.builder().maxInstances(1);
    if (!mode.equals("build-time")) {
      try (var in = PolicyRuntime.class.getResourceAsStream("backstop.wasm")) {
        b.wasm(in.readAllBytes());
      }
    }
    b.compiled(!mode.equals("interpreter"));
    try (PolicyRuntime rt = b.build();
        Policy p = rt.preset("default")) {
      return p.decide(Failure.builder().attempt(1).httpStatus(503).random(0.5).nowMs(0).build());
    }
  }
}
