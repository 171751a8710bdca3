// Package grpccode names the canonical gRPC status codes, for the policy
// file's parser (policy) and the vectors' (internal/vector): one table,
// that no importer can change.
package grpccode

// names are the canonical gRPC status names, indexed by code.
var names = [Count]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
	"INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

// Count is the number of codes: 0 (OK) to 16 (UNAUTHENTICATED).
const Count = 17

// Names returns the names indexed by code: a copy.
func Names() [Count]string { return names }
