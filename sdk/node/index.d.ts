export * from './contract.gen.js';
import type {Decision, Failure, Lint, Outcome, OutcomeEvent, PolicyCalls, PolicyFacts, Reason} from './contract.gen.js';

/**
A loaded policy: a handle into backstop.wasm with its own retry budget and circuit breaker. Two policies never share state, even when loaded from the same configuration. Its methods of one call each (`recordSuccess`, `recordDuration`, `circuitState`, `acquire`, `budgetTokens`, `attemptTimeout`) are `PolicyCalls`, and `stateful` and `onOpen` are `PolicyFacts`, documented in contract/abi.json for every language.
*/
export interface Policy extends PolicyCalls, PolicyFacts {
	/**
	Decides one failure.

	@throws {InputError} When a field is invalid (`attempt: must be >= 1 (got 0)`) or unknown (`http_stauts: unknown field`): the first in the order of the shared vectors' fields, after unknown names. No state changes then.

	@example
	```
	const decision = policy.decide({attempt: 2, httpStatus: 503, retryAfter: response.headers.get('retry-after')});
	if (decision.action === 'retry') {
		await setTimeout(decision.delayMs);
	}
	```
	*/
	decide(failure: Failure): Decision;

	/**
	Decides many failures in order (a stateful policy sees them as a sequence), in one call per 256 failures.

	@throws {InputError} With `index`, for the first invalid failure, once every valid failure has been decided (and counted by a stateful policy's budget and breaker, in order); its `decisions` hold them, `null` at each invalid index. An invalid failure never stops the batch, as in every backstop host.
	*/
	decideMany(failures: readonly Failure[]): Decision[];

	/**
	The policy's `connect_timeout` in milliseconds, `0` when it has none (the client's own applies): how long establishing a connection may take within an attempt, for the client to enforce. A connect that runs out (undici's `UND_ERR_CONNECT_TIMEOUT`) is the error kind `connect_timeout`, not `timeout`. undici's timer has a resolution of about 1 s.

	@example
	```
	import {Agent} from 'undici';

	const policy = await loadPolicy({attempt_timeout: '2s', connect_timeout: '500ms'});
	const dispatcher = new Agent({connect: {timeout: policy.connectTimeout}});
	await retry(() => fetch(url, {dispatcher}), {policy});
	```
	*/
	readonly connectTimeout: number;

	/**
	The policy's lints (docs/policy.md, "Lints"): choices the retry guidance names as classic mistakes, which the policy still decides as written. Each was also emitted at load as a process warning of type `BackstopLintWarning` with the lint's code, once per process for each lint text (`process.on('warning', …)`; `node --no-warnings` silences them). Lints the policy's `lint_ignore` names are left out.

	@example
	```
	const policy = await loadPolicy({jitter: {mode: 'none'}});
	policy.lints[0].code; //=> 'BP002'
	```
	*/
	readonly lints: readonly Lint[];

	/**
	What a queue worker does about one event of a job, decided by the core (wasm/ABI.md, "outcome"): before it runs (the breaker's gate), after a success or a failure (with the failure's fields and the job's own facts: its attempt, elapsed time, previous delay, its id as `idempotencyKey`), or once a broker delivered it `deliveries` times without an outcome (`maxDeliveries`: the limit, 0 none). The queue workers ask it; a failure it refuses as invalid input is dead-lettered as `malformed` (`invalid`, with the `InputError` as `error`), not thrown.

	@throws {InputError} For an invalid event: a `nowMs` that is negative or `0` on a stateful policy (before, success), a negative `deliveries` or `maxDeliveries`.

	@example
	```
	policy.outcome({event: 'failure', attempt: 2, httpStatus: 503, idempotencyKey: job.id});
	//=> {action: 'retry', reason: 'transient', delayMs: 2000, pause: false, count: 'retry', invalid: false}
	```
	*/
	outcome(event: OutcomeEvent): Outcome;

	/** Frees the handle. Using the policy afterwards throws. Policies that are garbage collected are freed too. */
	close(): void;
}

/** A compiled `WebAssembly.Module`, where the TypeScript libs in use declare it. */
type CompiledModule = typeof globalThis extends {WebAssembly: {Module: {prototype: infer M}}} ? M : object;

export interface LoadOptions {
	/**
	The backstop.wasm to run instead of the bundled one: its bytes or a compiled module. Each distinct value gets its own module instance; the bundled module has one per process.

	@default the bundled backstop.wasm
	@example await WebAssembly.compileStreaming(fetch(new URL('backstop-policy/backstop.wasm', import.meta.url)))
	*/
	readonly wasm?: CompiledModule | ArrayBuffer | ArrayBufferView;
}

/**
Loads a policy.

@param config - A preset name (a `PresetName`: `default`, `critical`, …), a JSON or YAML policy string, a plain object (see docs/policy.md), or the bytes of a policy file.
@throws {PolicyError} When the policy is invalid; the message names each field.

@example
```
import {loadPolicy} from 'backstop-policy';

const policy = await loadPolicy({extends: 'critical', max_attempts: 4});
```
*/
export function loadPolicy(config: string | Readonly<Record<string, unknown>> | ArrayBuffer | ArrayBufferView, options?: LoadOptions): Promise<Policy>;

export interface RetryContext {
	/** The number of the attempt that failed, from 1. */
	readonly attempt: number;
	/** What `fn` threw, unless it returned a failed Response. */
	readonly error?: unknown;
	/** The failed fetch Response `fn` returned, if so. Its body has been cancelled. */
	readonly response?: Response;
	/** The policy's decision. */
	readonly decision: Decision;
	/** The wait before the next attempt, in milliseconds. */
	readonly delayMs: number;
}

/**
The failure fields retry() found in a thrown error or a failed Response, or your own from `classify`.
*/
export type FailureFields = Omit<Failure, 'attempt' | 'elapsedMs' | 'prevDelayMs'>;

export interface RetryOptions {
	/**
	The policy that decides: a policy from `loadPolicy()` (load it once and reuse it, so its budget and breaker see every call), or a preset name.

	@default 'default'
	@example await loadPolicy('critical')
	*/
	readonly policy?: Policy | string;

	/**
	Stops retrying: an abort before an attempt or during a wait rejects with `signal.reason` at once.

	@default undefined
	@example AbortSignal.timeout(30_000)
	*/
	readonly signal?: AbortSignal;

	/**
	Called after a failed attempt that will be retried, before the wait. If it throws or rejects, retry() rejects with that error.

	@default undefined
	@example ({attempt, decision}) => log.warn({attempt, delayMs: decision.delayMs}, 'retrying')
	*/
	readonly onRetry?: (context: RetryContext) => void | Promise<void>;

	/**
	The HTTP method of the request `fn` makes, for the idempotency gate: POST and PATCH are not retried without `idempotencyKey`, unless the request provably never left (connection refused, DNS failure).

	@default undefined (not HTTP)
	@example 'POST'
	*/
	readonly method?: string;

	/**
	The idempotency key the request carries.

	@default undefined
	@example crypto.randomUUID()
	*/
	readonly idempotencyKey?: string;

	/**
	Maps a thrown error or a failed Response to failure fields, for errors retry() does not know (a gRPC client's, say). Return `undefined` to use the built-in mapping: `status`/`statusCode`/`response.status` and `Retry-After`, `TimeoutError`, and the `code` (or `cause.code`) ECONNRESET, ECONNREFUSED, ETIMEDOUT, EAI_AGAIN, ENOTFOUND. A `RetryError` of a `retry()` inside `fn` is classified by its last failure (its `response`, else its `cause`: that is what `classify` gets), then marked `retriedDownstream` unless it is `circuit_open`.

	@default undefined
	@example (error) => (error?.code >= 1 && error?.code <= 16 ? {grpcCode: error.code} : undefined)
	*/
	readonly classify?: (errorOrResponse: unknown) => FailureFields | undefined;

	/**
	Counts attempts, retries, refused calls, retry delays (decided) and latencies (measured, failure to the next start), breaker state and budget tokens (the backstop_client_* families every language exports), from `createMetrics()`.

	@default undefined (no metrics)
	@example createMetrics(promClient, {policy: 'payments', target: 'charge-api'})
	*/
	readonly metrics?: Metrics;

	/**
	The headers of the request `fn` sends (a plain object or a `Headers`, the one passed to `fetch`): before each attempt retry() sets `backstop-attempt` and `x-envoy-attempt-count` to the attempt number on it, except a header the caller set before the first attempt (docs/layers.md).

	@default undefined (no attempt headers)
	@example
	```
	const headers = new Headers();
	await retry(() => fetch(url, {headers}), {headers});
	```
	*/
	readonly headers?: Headers | Record<string, string | string[] | undefined>;

	/**
	When the policy gives up after an attempt that threw, throw that error itself instead of a `RetryError` (p-retry's behaviour, tenacity's `reraise`), for code that catches the client's errors. An attempt that returned a failed `Response` threw nothing: it still ends in a `RetryError` with the `response`, as does a call the circuit breaker refused.

	@default false
	*/
	readonly reraise?: boolean;
}

/** The process metrics of one policy and target: pass to `retry({metrics})` or a queue worker. */
export interface Metrics {
	readonly policy: string;
	readonly target: string;
}

export interface MetricsOptions {
	/** The policy label: a name you choose from a small fixed set, never a URL or an id. */
	readonly policy: string;
	/** The target label: the dependency's name. A queue worker uses the queue's name. */
	readonly target: string;
	/**
	The prom-client Registry to register in. A second createMetrics on it reuses the collectors; other metrics under the same names are an error.

	@default promClient.register
	*/
	readonly registry?: unknown;
}

/**
The backstop_client_* metrics in prom-client, which is not a dependency of this package: pass its module.

@example createMetrics(promClient, {policy: 'payments', target: 'charge-api'})
@throws {TypeError} When `policy` or `target` is empty or not valid UTF-8 (a lone surrogate), or `promClient` is not the prom-client module.
*/
export function createMetrics(promClient: unknown, options: MetricsOptions): Metrics;

/**
Runs `fn` until it succeeds or the policy says stop. A failure is a thrown error or a returned fetch `Response` whose status is 400 or more. Between attempts it waits the decided delay (Retry-After included).

Retry at one layer (docs/layers.md): a `RetryError` thrown by a `retry()` inside `fn` (one that made a call: not `circuit_open`), or a response with `Backstop-No-Retry`, is a failure a layer below already retried: the default policy stops at once with `retried_downstream`; a response with `X-Envoy-Overloaded` stops it with `server_declined`. Inside a request served by `oneLayer` or `backstopFastify`, the reason a loop gave up is sent back in `Backstop-No-Retry` on a failed response.

Each attempt is bounded by the policy's `attempt_timeout` and what is left of `max_elapsed` (`policy.attemptTimeout()`): `fn` gets a `signal` that aborts at that deadline (and when the caller's `signal` aborts), and is not waited for past it even if it ignores the signal. The expired attempt fails with a `TimeoutError` (error kind `timeout`), decided as any failure: retried if the policy says so, else the `RetryError`'s `cause`.

@param fn - Receives the attempt number, from 1, and `{signal}`: pass it to the call (`fetch(url, {signal})`).
@returns What `fn` returned on success.
@throws {RetryError} When the policy stops retrying; it keeps the reason, the attempts, the last error (`cause`) and the last failed `response`.
@throws The abort reason when `signal` aborts, or an `AbortError` thrown by `fn`, at once.

@example
```
import {retry, loadPolicy} from 'backstop-policy';

const policy = await loadPolicy('critical');
const response = await retry(() => fetch(url), {policy, signal: AbortSignal.timeout(10_000)});
```
*/
export function retry<T>(fn: (attempt: number, context: AttemptContext) => PromiseLike<T> | T, options?: RetryOptions): Promise<T>;

/** What `retry()` hands `fn` with the attempt number. */
export interface AttemptContext {
	/** Aborts at the attempt's deadline (reason: a `TimeoutError`) or when the caller's `signal` aborts; the caller's `signal` itself (or `undefined`) when no timeout applies. */
	readonly signal?: AbortSignal;
}

/**
A policy that backstop.wasm refused. The message names every invalid field: `invalid policy: backoff.cap: must be >= backoff.base (got 100ms < 1s)`.
*/
export class PolicyError extends Error {
	readonly name: 'PolicyError';
	/** The first invalid field's path, such as `backoff.cap`. */
	readonly field: string;
	/** Every problem, in file order. */
	readonly problems: ReadonlyArray<{readonly field: string; readonly reason: string}>;
}

/**
An invalid failure. The message is the one every backstop host reports: `attempt: must be >= 1 (got 0)` (prefixed with `failures[i]: ` from decideMany).
*/
export class InputError extends Error {
	readonly name: 'InputError';
	/** The field, in the vectors' snake_case (`attempt`, `http_status`, …), or an unknown name as given, or `failure` when the failure is not an object. */
	readonly field: string;
	readonly reason: string;
	/** The position in decideMany's failures. */
	readonly index?: number;
	/** From decideMany: the decision of every failure, `null` where invalid. */
	readonly decisions?: ReadonlyArray<Decision | null>;
}

/**
Thrown by every call on a stateful policy (one with a retry budget or a circuit breaker) whose module instance trapped: its budget and breaker state were lost with the instance, and reloading them from the file would silently close a tripped breaker. Load the policy again. Stateless policies survive a trap (wasm/ABI.md, "When an instance traps").
*/
export class StateLostError extends Error {
	readonly name: 'StateLostError';
}

/**
Thrown by retry() when the policy stops retrying.
*/
export class RetryError extends Error {
	readonly name: 'RetryError';
	/** Why retrying stopped, such as `max_attempts_reached` or `permanent_error`. */
	readonly reason: Reason;
	/** The number of attempts made. */
	readonly attempts: number;
	/** The last decision. */
	readonly decision: Decision;
	/** The last error `fn` threw; undefined when it returned a failed Response. */
	readonly cause: unknown;
	/** The last failed Response `fn` returned, unread. */
	readonly response?: Response;
}

/** The HTTP headers of attempt `n` (1 for the first call): `{'backstop-attempt': 'n', 'x-envoy-attempt-count': 'n'}`. */
export function attemptHeaders(n: number): {'backstop-attempt': string; 'x-envoy-attempt-count': string};

/** The gRPC metadata of attempt `n`: `backstop-attempt`, and `grpc-previous-rpc-attempts` (`n - 1`) on a retry (`n > 1`), as gRPC's own retries send it. */
export function grpcAttemptMetadata(n: number): {'backstop-attempt': string; 'grpc-previous-rpc-attempts'?: string};

export interface OneLayerOptions {
	/**
	The policies the service calls its dependencies with: while the breaker of any of them is open, a request is answered at once with 503, `Backstop-No-Retry: circuit_open` and `X-Envoy-Overloaded: true`, without running the handler. A policy without a breaker is never open.

	@default []
	*/
	readonly policies?: readonly Policy[];
}

/**
Wraps a `node:http` request listener for retry at one layer (docs/layers.md): sheds requests while a breaker of `policies` is open, and, when a `retry()` loop inside the request gave up (any reason), adds `Backstop-No-Retry: <reason>` to a failed response (status 400 or more) unless the handler set it. The loops find the request through an `AsyncLocalStorage`: the handler changes nothing.

@example
```
import {createServer} from 'node:http';
import {oneLayer, retry} from 'backstop-policy';

createServer(oneLayer(async (req, res) => {
	const r = await retry(() => fetch(url)).catch(() => null);
	res.writeHead(r ? 200 : 503).end();
}, {policies: [policy]}));
```
*/
export function oneLayer<Req = unknown, Res = unknown>(handler: (req: Req, res: Res) => unknown, options?: OneLayerOptions): (req: Req, res: Res) => unknown;

/**
A Fastify plugin (Fastify 4 or 5), `oneLayer` for the routes of the instance it is registered on: `fastify.register(backstopFastify, {policies})`.
*/
export function backstopFastify(fastify: unknown, options: OneLayerOptions, done: (err?: Error) => void): void;
