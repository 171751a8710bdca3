package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.Test;

/**
 * The module instances: memory stays bounded, the clock is virtual, a trap
 * retires only its instance, and calls from many threads are safe
 * (wasm/ABI.md, "Clocks" and "When an instance traps").
 */
class InstanceTest {
  private static final String STATEFUL = "{\"max_attempts\": 8,"
      + " \"retry_budget\": {\"type\": \"token_bucket\", \"max_tokens\": 6, \"token_ratio\": 0.5},"
      + " \"circuit_breaker\": {\"failure_threshold\": 4, \"open_for\": \"2s\", \"half_open_successes\": 1}}";
  private static final Failure FAILURE =
      Failure.builder().attempt(1).httpStatus(503).nowMs(1_700_000_000_000L).random(0.5).build();

  /** A policy of about 3.9 KB: a long classification table. */
  private static String policy3900() {
    StringBuilder http = new StringBuilder();
    for (int code = 100; http.length() < 3700; code++) {
      if (http.length() > 0) http.append(',');
      http.append('"').append(code).append("\":\"permanent\"");
    }
    return "{\"max_attempts\":8,\"backoff\":{\"strategy\":\"exponential\",\"base\":\"1s\",\"multiplier\":2,"
        + "\"cap\":\"300s\"},\"classify\":{\"http\":{" + http + "}}}";
  }

  @Test
  void loadingAndClosingPoliciesKeepsMemoryBounded() {
    try (PolicyRuntime rt = PolicyRuntime.builder().maxInstances(1).build()) {
      String data = policy3900();
      for (int i = 0; i < 1500; i++) rt.load(data).close();
      int pages = rt.slot(0).pages();
      assertTrue(pages <= 400, pages + " pages after 1,500 load/close cycles"); // about 150 are used
    }
  }

  @Test
  void growingTheBufferToItsMaximumKeepsMemoryBounded() {
    try (PolicyRuntime rt = PolicyRuntime.builder().maxInstances(1).build()) {
      ModuleInstance in = rt.slot(0);
      int page = 64 << 10;
      for (int n = page; n <= Contract.MAX_BUFFER; n += page) assertTrue(in.rawBuffer(n) > 0, "buffer(" + n + ")");
      assertTrue(in.pages() <= 3 * Contract.MAX_BUFFER / page, in.pages() + " pages for a 64 MiB buffer");
      assertEquals(-4, in.rawBuffer(Contract.MAX_BUFFER + 1));
      assertTrue(in.lastError().contains("size must be in 0..67108864 (got 67108865)"), in.lastError());
    }
  }

  @Test
  void theModuleReadsVirtualTimeNeverTheHostClock() {
    try (PolicyRuntime rt = PolicyRuntime.builder().maxInstances(1).build()) {
      ModuleInstance in = rt.slot(0);
      long start = in.wasi.now();
      for (int i = 0; i < 50; i++) {
        try (Policy p = rt.load("{\"max_attempts\": 3, \"classify\": {\"http\": {\"418\": \"retryable\"}}}")) {
          p.decide(Failure.builder().attempt(1).httpStatus(418).build());
        }
      }
      // 1 ms per call (load, stateful, on_open, attempt_timeout,
      // connect_timeout, free; decide does not step), 1 ns per reading: the
      // Go runtime reads the clock a few times per GC cycle.
      long ns = in.wasi.now() - start;
      assertEquals(300, ns / 1_000_000);
      assertTrue(ns % 1_000_000 < 100_000, ns + " ns");
    }
  }

  /** Makes an instance trap for real and cheaply: its memory is capped, and a 40 MiB buffer runs the Go runtime out of it. */
  private static void exhaustMemory(ModuleInstance in) {
    BackstopException e = assertThrows(BackstopException.class, () -> in.rawBuffer(40 << 20));
    assertTrue(e.getMessage().startsWith("backstop.wasm crashed in buffer"), e.getMessage());
    assertTrue(in.dead != null);
  }

  private static PolicyRuntime capped(int instances) {
    return PolicyRuntime.builder().maxInstances(instances).maxMemoryPages(400).build();
  }

  @Test
  void aTrapRetiresOnlyItsInstance() {
    try (PolicyRuntime rt = capped(1)) {
      Policy stateless = rt.preset("default");
      Policy stateful = rt.load(STATEFUL);
      assertTrue(stateful.isStateful() && !stateless.isStateful());
      Decision before = stateless.decide(FAILURE);
      stateful.decide(FAILURE);
      ModuleInstance first = rt.slot(0);

      exhaustMemory(first);

      for (int i = 0; i < 2; i++) { // the same error every time
        List<Runnable> calls = List.of(() -> stateful.decide(FAILURE), () -> stateful.recordSuccess(1),
            () -> stateful.circuitState(1), () -> stateful.acquire(1), () -> stateful.budgetTokens(1),
            () -> stateful.attemptTimeout(0));
        for (Runnable call : calls) {
          StateLostException e = assertThrows(StateLostException.class, call::run);
          assertTrue(e.getMessage().matches("(?s).*retry budget and circuit breaker were lost .*; load the policy again"),
              e.getMessage());
        }
      }
      stateful.close();
      stateful.close();

      // The stateless policy is loaded again into a fresh instance.
      assertEquals(before, stateless.decide(FAILURE));
      assertNotSame(first, rt.slot(0));
      try (Policy again = rt.load(STATEFUL)) {
        assertTrue(again.isStateful());
        assertEquals(Decision.Action.RETRY, again.decide(FAILURE).action());
      }
      stateless.close();
    }
  }

  @Test
  void aTrapSparesThePoliciesOfOtherInstancesAndRuntimes() {
    try (Policy bundled = Policy.load(STATEFUL); PolicyRuntime rt = capped(2)) {
      Policy a = rt.load(STATEFUL); // slot 0
      Policy b = rt.load(STATEFUL); // slot 1
      for (int i = 0; i < 3; i++) {
        bundled.decide(FAILURE);
        b.decide(FAILURE);
      }
      exhaustMemory(rt.slot(0));
      assertThrows(StateLostException.class, () -> a.decide(FAILURE));
      // b's breaker saw three failures: the fourth opens it (failure_threshold 4).
      assertEquals(CircuitState.CLOSED, b.circuitState(FAILURE.nowMs));
      b.decide(FAILURE);
      assertEquals(CircuitState.OPEN, b.circuitState(FAILURE.nowMs));
      bundled.decide(FAILURE);
      assertEquals(CircuitState.OPEN, bundled.circuitState(FAILURE.nowMs));
      a.close();
      b.close();
    }
  }

  @Test
  void callsFromManyThreadsGiveTheSingleThreadedAnswers() throws Exception {
    try (PolicyRuntime rt = PolicyRuntime.builder().maxInstances(2).build()) {
      List<Policy> policies = List.of(rt.preset("default"), rt.preset("critical"), rt.preset("batch"));
      List<String> want = new ArrayList<>();
      for (int i = 0; i < 300; i++) want.add(decideAll(policies, i));
      ExecutorService pool = Executors.newFixedThreadPool(4);
      try {
        List<Future<String>> got = new ArrayList<>();
        for (int i = 0; i < 300; i++) {
          int k = i;
          got.add(pool.submit(() -> decideAll(policies, k)));
        }
        for (int i = 0; i < 300; i++) assertEquals(want.get(i), got.get(i).get());
      } finally {
        pool.shutdown();
      }
      policies.forEach(Policy::close);
    }
  }

  private static String decideAll(List<Policy> policies, int i) {
    StringBuilder b = new StringBuilder();
    for (Policy p : policies) {
      Failure f = Failure.builder().attempt(1 + i % 7).httpStatus(i % 2 == 0 ? 503 : 429).retryAfter(i % 3 == 0 ? "2" : "")
          .method(i % 5 == 0 ? "POST" : "GET").random((i % 10) / 10.0).nowMs(1_767_225_600_000L).build();
      b.append(p.decide(f).toJson());
    }
    return b.toString();
  }
}
