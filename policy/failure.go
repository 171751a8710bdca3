package policy

// A *Failure is also an error: a handler or an operation returns one to say
// how it failed ("the downstream answered 503 with Retry-After: 7"), and
// backstop.ClassifyError reads it back. The policy itself never reads Err.

func (f *Failure) Error() string {
	if f.Err != nil {
		return f.Err.Error()
	}
	return "failure"
}

func (f *Failure) Unwrap() error { return f.Err }
