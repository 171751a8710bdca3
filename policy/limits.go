package policy

// Limits on a policy file. Real policies are a few hundred bytes to a few
// kilobytes, with tables of tens of entries; the limits sit far above that
// and far below what would make parsing slow or large in any host (every
// host parses through this code, compiled to WebAssembly, where the worst
// 64 KiB file takes about 0.2 s). Parse reports an input over a limit as
// an *Error naming the field, as for any other invalid value.
const (
	// MaxFileBytes bounds the size of a policy file. Parse checks it
	// before reading anything else.
	MaxFileBytes = 64 << 10

	// MaxTableEntries bounds each classification table (classify.http,
	// classify.grpc, classify.error_kinds). A table over it is reported
	// once, without a problem per entry.
	MaxTableEntries = 1000

	// MaxListItems bounds each list (idempotency.idempotent_methods,
	// idempotency.never_sent_kinds). Decisions scan the methods list, so
	// it stays short.
	MaxListItems = 100

	// MaxProblems bounds the problems an *Error lists; Error.More counts
	// the others.
	MaxProblems = 20
)
