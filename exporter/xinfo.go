package exporter

// XINFO replies are read as the server sends them, not through go-redis's
// typed commands: those give 0 for a field the server leaves out (Redis 6
// has no entries-added, entries-read or lag; the embedded server of
// `backstop demo` has no entries-added) and for a NULL entries-read, so an
// unknown figure would look like a true 0.

// replyFields returns the field-value pairs of one XINFO reply, a map in
// RESP3 and a flat array in RESP2; nil when v is neither.
func replyFields(v any) map[string]any {
	out := map[string]any{}
	switch r := v.(type) {
	case map[any]any:
		for k, val := range r {
			if name, ok := k.(string); ok {
				out[name] = val
			}
		}
	case []any:
		if len(r)%2 != 0 {
			return nil
		}
		for i := 0; i < len(r); i += 2 {
			if name, ok := r[i].(string); ok {
				out[name] = r[i+1]
			}
		}
	default:
		return nil
	}
	return out
}

// replyInt returns field name of fields as an integer, and false when the
// server left it out or sent NULL (or anything but an integer).
func replyInt(fields map[string]any, name string) (int64, bool) {
	n, ok := fields[name].(int64)
	return n, ok
}

// badReply is a reply the exporter cannot read: counted as a reply error
// (kindReply), like an error reply, not as a lost connection.
type badReply string

func (e badReply) Error() string { return string(e) }

// RedisError marks badReply as a redis.Error.
func (badReply) RedisError() {}
