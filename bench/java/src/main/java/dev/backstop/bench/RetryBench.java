package dev.backstop.bench;

import dev.backstop.Backstop;
import dev.backstop.Decision;
import dev.backstop.Failure;
import dev.backstop.Policy;
import dev.backstop.PolicyRuntime;
import io.github.resilience4j.core.IntervalBiFunction;
import io.github.resilience4j.core.IntervalFunction;
import io.github.resilience4j.core.functions.Either;
import io.github.resilience4j.retry.Retry;
import io.github.resilience4j.retry.RetryConfig;
import java.io.IOException;
import java.net.SocketTimeoutException;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OperationsPerInvocation;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * backstop-policy (backstop.wasm on Chicory, compiled and interpreted)
 * beside Resilience4j's Retry, in one run.
 *
 * <p>Per decision: what each library computes when an attempt fails.
 * backstop: one Policy.decide (classification of an HTTP 503 and an error
 * kind, the idempotency gate, limits, exponential backoff with full jitter,
 * through the module). Resilience4j: its exception predicate plus its
 * interval function (exponential backoff with randomization), what its Retry
 * computes per failed attempt. Resilience4j decides much less (no status or
 * Retry-After classification, no gate, no elapsed limit); the figures say
 * what each costs, not that they do the same work.
 *
 * <p>Retry loop: an operation that fails N = 3 times (an IOException) and
 * then succeeds, under a policy with no delay (backstop: backoff strategy
 * none; Resilience4j: a zero wait), so nothing sleeps and the figure is the
 * loop's own overhead: 4 calls, 3 decisions.
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Warmup(iterations = 3, time = 2)
@Measurement(iterations = 5, time = 2)
@Fork(1)
@State(Scope.Benchmark)
public class RetryBench {
  private static final int FAILURES = 3;
  private static final int BATCH = 256;
  private List<Failure> batch;

  private PolicyRuntime interpreted;
  private Policy compiledPolicy;
  private Policy interpretedPolicy;
  private Policy noDelay;
  private Failure failure;
  private Failure kindFailure;

  private IntervalBiFunction<Object> r4jInterval;
  private Predicate<Throwable> r4jPredicate;
  private Retry r4jRetry;

  private final IOException ioError = new SocketTimeoutException("read timed out");
  private int calls;

  @Setup(Level.Trial)
  public void setup() {
    compiledPolicy = Policy.preset("default");
    interpreted = PolicyRuntime.builder().compiled(false).maxInstances(1).build();
    interpretedPolicy = interpreted.preset("default");
    noDelay = Policy.load("{\"max_attempts\": 5, \"backoff\": {\"strategy\": \"none\"}, \"jitter\": {\"mode\": \"none\"}}");
    failure = Failure.builder().attempt(3).httpStatus(503).method("GET").elapsedMs(1200).nowMs(1_767_225_600_000L)
        .random(0.37).build();
    kindFailure = Failure.builder().attempt(2).errorKind("timeout").elapsedMs(300).nowMs(1_767_225_600_000L)
        .random(0.37).build();

    batch = java.util.Collections.nCopies(BATCH, failure);

    RetryConfig decisionConfig = RetryConfig.custom().maxAttempts(5)
        .intervalFunction(IntervalFunction.ofExponentialRandomBackoff(Duration.ofMillis(1000), 2.0, 0.5))
        .retryExceptions(IOException.class).build();
    r4jInterval = decisionConfig.getIntervalBiFunction();
    r4jPredicate = decisionConfig.getExceptionPredicate();
    r4jRetry = Retry.of("bench", RetryConfig.custom().maxAttempts(5).waitDuration(Duration.ZERO)
        .retryExceptions(IOException.class).build());
  }

  @TearDown(Level.Trial)
  public void tearDown() {
    compiledPolicy.close();
    interpretedPolicy.close();
    noDelay.close();
    interpreted.close();
  }

  @Benchmark
  public Decision decideBackstopCompiled() {
    return compiledPolicy.decide(failure);
  }

  @Benchmark
  public Decision decideBackstopCompiledErrorKind() {
    return compiledPolicy.decide(kindFailure);
  }

  /** decideMany (decide_batch): 256 failures a call, the cost per decision. */
  @Benchmark
  @OperationsPerInvocation(BATCH)
  public List<Decision> decideManyBackstopCompiled() {
    return compiledPolicy.decideMany(batch);
  }

  @Benchmark
  public Decision decideBackstopInterpreted() {
    return interpretedPolicy.decide(failure);
  }

  @Benchmark
  public long decideResilience4j() {
    if (!r4jPredicate.test(ioError)) return -1;
    return r4jInterval.apply(3, Either.left(ioError));
  }

  private final Callable<String> flaky = () -> {
    if (calls++ % (FAILURES + 1) < FAILURES) throw ioError;
    return "ok";
  };

  @Benchmark
  public String loopBackstop() throws Exception {
    calls = 0;
    return Backstop.retry(noDelay, flaky);
  }

  @Benchmark
  public String loopResilience4j() throws Exception {
    calls = 0;
    return r4jRetry.executeCallable(flaky);
  }
}
