package retry_test

import "encoding/json"

// buildLayerCases lists the shared layer cases (their inputs; the expected
// part comes from running them, see TestLayerCases).

// layerPolicy is the file's policy: three attempts a few milliseconds
// apart, no jitter, so no random input matters.
const layerPolicy = `{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "5ms"}, "jitter": {"mode": "none"}}`

// optInPolicy is layerPolicy for a caller that retries what a layer below
// already retried.
const optInPolicy = `{"max_attempts": 3, "backoff": {"strategy": "constant", "base": "5ms"}, "jitter": {"mode": "none"}, "retried_downstream": "retry"}`

func status(code int, headers ...string) layerResponse {
	r := layerResponse{Status: code}
	for i := 0; i+1 < len(headers); i += 2 {
		if r.Headers == nil {
			r.Headers = map[string]string{}
		}
		r.Headers[headers[i]] = headers[i+1]
	}
	return r
}

func buildLayerCases() []layerCase {
	optIn := json.RawMessage(optInPolicy)
	noRetry := []string{"Backstop-No-Retry", "max_attempts_reached"}
	overloaded := []string{"X-Envoy-Overloaded", "true"}
	return []layerCase{
		// One loop calling the service: it retries, and honours the
		// service's "do not retry".
		{Name: "one-layer/503", Bottom: []layerResponse{status(503)}},
		{Name: "one-layer/503-then-200", Bottom: []layerResponse{status(503), status(200)}},
		{Name: "one-layer/no-retry-header", Bottom: []layerResponse{status(503, noRetry...)}},
		{Name: "one-layer/no-retry-header-opt-in", Policy: optIn, Bottom: []layerResponse{status(503, noRetry...)}},
		{Name: "one-layer/no-retry-header-on-400", Bottom: []layerResponse{status(400, noRetry...)}},
		{Name: "one-layer/overloaded", Bottom: []layerResponse{status(503, overloaded...)}},
		{Name: "one-layer/overloaded-opt-in", Policy: optIn, Bottom: []layerResponse{status(503, overloaded...)}},
		{Name: "one-layer/429-overloaded", Bottom: []layerResponse{status(429, "Retry-After", "0", overloaded[0], overloaded[1])}},

		// Two loops in one process: the outer one does not retry what the
		// inner one gave up, unless it opts in.
		{Name: "nested/503", InnerLoop: true, Bottom: []layerResponse{status(503)}},
		{Name: "nested/recovers", InnerLoop: true, Bottom: []layerResponse{status(503), status(200)}},
		{Name: "nested/400", InnerLoop: true, Bottom: []layerResponse{status(400)}},
		{Name: "nested/opt-in", InnerLoop: true, Policy: optIn, Bottom: []layerResponse{status(503)}},

		// Three layers: top loop, a middle service whose loop calls a
		// flaky bottom service, the bottom.
		{Name: "layers/3", Middle: &layerMiddle{}, Bottom: []layerResponse{status(503)}},
		{Name: "layers/3-recovers", Middle: &layerMiddle{}, Bottom: []layerResponse{status(503), status(503), status(200)}},
		{Name: "layers/3-bottom-400", Middle: &layerMiddle{}, Bottom: []layerResponse{status(400)}},
		{Name: "layers/3-opt-in", Policy: optIn, Middle: &layerMiddle{}, Bottom: []layerResponse{status(503)}},
		{Name: "layers/3-middle-opt-in", Middle: &layerMiddle{Policy: optIn}, Bottom: []layerResponse{status(503, noRetry...)}},
		{Name: "layers/breaker-open", Middle: &layerMiddle{BreakerOpen: true}, Bottom: []layerResponse{status(200)}},
		{Name: "layers/breaker-open-opt-in", Policy: optIn, Middle: &layerMiddle{BreakerOpen: true}, Bottom: []layerResponse{status(200)}},
	}
}
