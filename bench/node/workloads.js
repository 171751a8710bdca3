// The failures the Node.js benchmarks decide (bench.js, paired.js,
// ../issue41_node.mjs): one module, so every comparison times the same work.
export const T0 = 1767225600000;

// The workload of bench/decide_test.go: a mix of classes, attempts, a
// Retry-After header and methods, as a worker sees them.
export const mixed = Array.from({ length: 1024 }, (_, i) => {
  const f = { attempt: 1 + (i % 5), random: (i % 97) / 97, elapsedMs: i * 37, nowMs: T0 };
  switch (i % 8) {
    case 0: case 1: case 2: f.httpStatus = 503; break;
    case 3: f.httpStatus = 429; f.retryAfter = '3'; break;
    case 4: f.grpcCode = 14; break;
    case 5: f.errorKind = 'timeout'; break;
    case 6: f.httpStatus = 400; break;
    default: f.httpStatus = 502; f.method = 'GET';
  }
  return f;
});
// The same shape as exponential-backoff's input: an attempt number and a draw.
export const plain = Array.from({ length: 1024 }, (_, i) => ({ attempt: 1 + (i % 5), httpStatus: 503, random: (i % 97) / 97, nowMs: T0 }));
