package dev.backstop;

import java.util.ArrayList;
import java.util.List;

/** The retry loop's clock on a fake: it moves only by the delays slept and advance(). Tests never sleep. */
final class FakeTicker implements Retry.Ticker {
  long nowMs;
  final List<Long> slept = new ArrayList<>();

  FakeTicker(long startMs) {
    this.nowMs = startMs;
  }

  void advance(long ms) {
    nowMs += ms;
  }

  @Override
  public long nowMs() {
    return nowMs;
  }

  @Override
  public long nanos() {
    return nowMs * 1_000_000;
  }

  @Override
  public void sleep(long ms) {
    slept.add(ms);
    nowMs += ms;
  }
}
