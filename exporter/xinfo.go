package exporter

// XINFO replies are read as the server sends them, not through go-redis's
// typed commands: those give 0 for a field the server leaves out (Redis 6
// has no entries-added, entries-read or lag; the embedded server of
// `backstop demo` has no entries-added) and for a NULL entries-read, so an
// unknown figure would look like a true 0.

// replyFields is one XINFO reply's field-value pairs, a map in RESP3 and
// a flat array in RESP2, read in place: copying them into a map of our
// own cost a map per queue per scrape. The zero value (a reply that is
// neither) has no field.
type replyFields struct {
	m map[any]any
	a []any
}

func fieldsOf(v any) replyFields {
	switch r := v.(type) {
	case map[any]any:
		return replyFields{m: r}
	case []any:
		if len(r)%2 == 0 {
			return replyFields{a: r}
		}
	}
	return replyFields{}
}

// get returns field name, nil when the reply has none.
func (f replyFields) get(name string) any {
	if f.m != nil {
		return f.m[name]
	}
	for i := 0; i < len(f.a); i += 2 {
		if k, ok := f.a[i].(string); ok && k == name {
			return f.a[i+1]
		}
	}
	return nil
}

// replyInt returns field name of fields as an integer, and false when the
// server left it out or sent NULL (or anything but an integer).
func replyInt(fields replyFields, name string) (int64, bool) {
	n, ok := fields.get(name).(int64)
	return n, ok
}

// badReply is a reply the exporter cannot read: counted as a reply error
// (kindReply), like an error reply, not as a lost connection.
type badReply string

func (e badReply) Error() string { return string(e) }

// RedisError marks badReply as a redis.Error.
func (badReply) RedisError() {}
