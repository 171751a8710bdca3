package rabbitmq

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/queue"
	"github.com/backstop-dev/backstop/queue/rabbitmq/rabbitnames"
)

// The headers every job carries (README, "Headers"). Numbers are written as
// strings of decimal digits; readers accept such a string or an AMQP
// integer.
const (
	HeaderAttempt         = "backstop-attempt"
	HeaderFirstEnqueuedMs = "backstop-first-enqueued-ms"
	HeaderDestination     = "backstop-destination"
	HeaderLastReason      = "backstop-last-reason"
	HeaderLastError       = "backstop-last-error"
	HeaderPrevDelayMs     = "backstop-prev-delay-ms"
	HeaderDueMs           = "backstop-due-ms"
	HeaderJobType         = "backstop-job-type"
	HeaderReason          = "backstop-reason"
	HeaderError           = "backstop-error"
	HeaderDeadLetteredMs  = "backstop-dead-lettered-ms"
	// HeaderDroppedHeaders lists the foreign headers dropped to keep a
	// message's header table under MaxHeaderBytes (comma-separated, at most
	// 1024 bytes).
	HeaderDroppedHeaders = "backstop-dropped-headers"
	// HeaderMoveRefusals counts the moves of a delayed message the broker
	// refused (nack) in a row; at maxMoveRefusals it is dead-lettered
	// (unroutable).
	HeaderMoveRefusals = "backstop-move-refusals"
)

// The bounds on what backstop writes into a message's headers (README,
// "Headers"): an error text at most MaxErrorBytes (with its truncation
// marker), the whole header table at most MaxHeaderBytes, under the
// broker's frame_max (128 KiB by default), which a header frame must not
// exceed; and a due time at most MaxDueAhead ahead.
const (
	MaxErrorBytes   = 8192
	MaxHeaderBytes  = 65536
	maxDroppedBytes = 1024
	MaxDueAhead     = 30 * 24 * time.Hour
)

// DueTooFarError is the error a delivery whose backstop-due-ms lies more
// than MaxDueAhead ahead is dead-lettered with (reason "malformed").
const DueTooFarError = "malformed message: backstop-due-ms is more than 30 days ahead"

// MalformedError is the error a malformed delivery is dead-lettered with
// (reason "malformed").
const MalformedError = "malformed message: needs message_id, backstop-attempt >= 1 and backstop-first-enqueued-ms"

// maxAttempt bounds backstop-attempt: 14 digits, as the Redis scripts.
const maxAttempt = 99_999_999_999_999

// Delay levels: a delay is whole seconds in delayBits bits, of which the
// lowest holdLevels are routed: a delay hops the levels for at most
// maxDelaySecs (34 min), so that no mover holds a message for longer than
// 2^(holdLevels-1) s, under the broker's consumer timeout (30 min).
const (
	delayBits     = 18
	holdLevels    = 11
	maxDelaySecs  = 1<<holdLevels - 1
	delayExchange = rabbitnames.DelayLevelPrefix // + level: the exchanges, and the first topology's TTL queues
	holdQueue     = rabbitnames.HoldLevelPrefix  // + level: the queues the movers hold messages from
	deliverXchg   = "backstop.delay.deliver"     // headers exchange, by destination
	enterXchg     = "backstop.delay.enter"       // topic exchange, to the highest set bit's level
)

// headerDigits reads a numeric header: a string of decimal digits or an
// AMQP integer. ok is false for anything else (a sign, a float, a
// negative number, too many digits).
func headerDigits(v any) (n int64, s string, ok bool) {
	switch x := v.(type) {
	case string:
		if x == "" || len(x) > 18 || strings.TrimLeft(x, "0123456789") != "" {
			return 0, x, false
		}
		n, err := strconv.ParseInt(x, 10, 64)
		return n, x, err == nil
	case int8:
		n = int64(x)
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case int:
		n = int64(x)
	case uint8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case uint64:
		if x > math.MaxInt64 {
			return 0, "", false
		}
		n = int64(x)
	default:
		return 0, "", false
	}
	if n < 0 {
		return 0, "", false
	}
	return n, strconv.FormatInt(n, 10), true
}

// headerString reads a text header (a string or bytes); "" otherwise.
func headerString(h amqp.Table, k string) string {
	switch x := h[k].(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	return ""
}

// Decode reads the job a delivery carries. EntryID is empty: a delivery
// tag means nothing outside its channel. A delivery (not plain, below)
// without message_id, with a backstop-attempt outside 1..10^14-1, or a backstop-first-enqueued-ms
// that is missing or not digits is Malformed (dead-lettered with reason
// malformed and MalformedError); its other fields are read as far as they
// can be.
//
// A plain message (neither backstop-attempt nor backstop-first-enqueued-ms:
// one a publisher that knows nothing of backstop sent) is attempt 1 of a
// job: its id the message_id (empty without one: the worker adopts such a
// message first, giving it an id of its own, README "Headers"); first
// enqueued at its timestamp property, or now without one.
func Decode(d amqp.Delivery) queue.Job {
	j := queue.Job{ID: d.MessageId, Payload: d.Body}
	h := d.Headers
	j.Type = headerString(h, HeaderJobType)
	if plain(h) {
		j.Attempt, j.FirstEnqueuedMs = 1, time.Now().UnixMilli()
		if d.Timestamp.Unix() > 0 {
			j.FirstEnqueuedMs = d.Timestamp.UnixMilli()
		}
		j.LastReason, j.LastError = headerString(h, HeaderLastReason), headerString(h, HeaderLastError)
		return j
	}
	attempt, as, aok := headerDigits(h[HeaderAttempt])
	first, _, fok := headerDigits(h[HeaderFirstEnqueuedMs])
	j.Attempt, j.FirstEnqueuedMs = attempt, first
	j.LastReason, j.LastError = headerString(h, HeaderLastReason), headerString(h, HeaderLastError)
	j.PrevDelayMs, _, _ = headerDigits(h[HeaderPrevDelayMs])
	j.DueMs = dueMs(h)
	leadingZero := len(as) > 1 && as[0] == '0'
	j.Malformed = j.ID == "" || !aok || attempt < 1 || attempt > maxAttempt || leadingZero || !fok
	return j
}

// plain reports a message without backstop's job headers (Decode).
func plain(h amqp.Table) bool {
	_, a := h[HeaderAttempt]
	_, f := h[HeaderFirstEnqueuedMs]
	return !a && !f
}

// dueMs returns backstop-due-ms, or 0 when absent or not a number.
func dueMs(h amqp.Table) int64 {
	n, _, ok := headerDigits(h[HeaderDueMs])
	if !ok {
		return 0
	}
	return n
}

// delaySeconds rounds d up to whole seconds (a message never arrives
// early), at least 0, at most maxDelaySecs: a longer delay is delayed again
// for the rest on arrival (backstop-due-ms).
func delaySeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64((d + time.Second - 1) / time.Second)
	return min(s, maxDelaySecs)
}

// delayRoutingKey is the routing key of a message delayed by secs seconds:
// its delayBits bits, most significant first, as words ("0.0.….1.0.1").
func delayRoutingKey(secs int64) string {
	var b strings.Builder
	for bit := delayBits - 1; bit >= 0; bit-- {
		if bit < delayBits-1 {
			b.WriteByte('.')
		}
		b.WriteByte('0' + byte(secs>>bit&1))
	}
	return b.String()
}

// levelPattern is the binding pattern of level n: the word of bit n is
// word, every other word '*'.
func levelPattern(n int, word byte) string {
	ws := make([]string, delayBits)
	for i := range ws {
		ws[i] = "*"
	}
	ws[delayBits-1-n] = string(word)
	return strings.Join(ws, ".")
}

// enterPattern is the binding pattern from the enter exchange to level n:
// the words of the bits above n '0', bit n's '1', the rest '*'.
func enterPattern(n int) string {
	ws := make([]string, delayBits)
	for i := range ws {
		switch bit := delayBits - 1 - i; {
		case bit > n:
			ws[i] = "0"
		case bit == n:
			ws[i] = "1"
		default:
			ws[i] = "*"
		}
	}
	return strings.Join(ws, ".")
}

// copyHeaders returns a copy of h to build the next message from: every
// header moves with the job (the job type, and headers of others).
func copyHeaders(h amqp.Table) amqp.Table {
	out := make(amqp.Table, len(h)+4)
	for k, v := range h {
		out[k] = v
	}
	return out
}

// next is the message that carries a delivery to its next place, with
// headers set as given (nil deletes one): the body, message_id, content
// type and every other header kept, within the bounds (boundHeaders). With
// stripBroker the broker's own headers (x-death: they describe the old
// place) go; a malformed message keeps them, for a person to read.
// x-delivery-count always goes: the next queue's worker would read it as
// its own count (crash loops).
func next(d amqp.Delivery, set map[string]any, stripBroker bool) amqp.Publishing {
	h := copyHeaders(d.Headers)
	delete(h, "x-delivery-count")
	for _, k := range []string{"x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
		"x-last-death-exchange", "x-last-death-queue", "x-last-death-reason"} {
		if stripBroker {
			delete(h, k)
		}
	}
	for k, v := range set {
		if v == nil {
			delete(h, k)
		} else {
			h[k] = v
		}
	}
	boundHeaders(h)
	return amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, MessageId: d.MessageId, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, Type: d.Type, AppId: d.AppId, Timestamp: d.Timestamp, Body: d.Body,
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// truncateError bounds an error text written into a header to
// MaxErrorBytes: a longer one is cut on a character boundary and ends with
// the marker " …[truncated: N bytes]", N its full length in bytes, the
// marker counted inside the bound.
func truncateError(s string) string {
	if len(s) <= MaxErrorBytes {
		return s
	}
	marker := " …[truncated: " + strconv.Itoa(len(s)) + " bytes]"
	cut := MaxErrorBytes - len(marker)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + marker
}

// boundHeaders keeps h, a header table about to be published, within the
// bounds (README, "Headers"): the error headers truncated (truncateError);
// then, while the encoded table exceeds MaxHeaderBytes, the foreign headers
// (neither backstop-* nor x-death) are dropped, largest first, and their
// names listed in backstop-dropped-headers, so that no publish can exceed
// the broker's frame_max (which closes the connection).
func boundHeaders(h amqp.Table) {
	for _, k := range []string{HeaderLastError, HeaderError} {
		if s, ok := h[k].(string); ok {
			h[k] = truncateError(s)
		}
	}
	size := tableSize(h)
	if size <= MaxHeaderBytes {
		return
	}
	type field struct {
		name string
		size int
	}
	var foreign []field
	for k, v := range h {
		if !strings.HasPrefix(k, "backstop-") && k != "x-death" {
			foreign = append(foreign, field{k, fieldSize(k, v)})
		}
	}
	sort.Slice(foreign, func(i, j int) bool {
		if foreign[i].size != foreign[j].size {
			return foreign[i].size > foreign[j].size
		}
		return foreign[i].name < foreign[j].name
	})
	var dropped []string
	if prev, ok := h[HeaderDroppedHeaders]; ok { // rewritten below, with the new names
		size -= fieldSize(HeaderDroppedHeaders, prev)
		delete(h, HeaderDroppedHeaders)
		if s := headerString(amqp.Table{"v": prev}, "v"); s != "" {
			dropped = append(dropped, s)
		}
	}
	// Room for the list of dropped names, at its largest.
	limit := MaxHeaderBytes - fieldSize(HeaderDroppedHeaders, strings.Repeat(" ", maxDroppedBytes))
	for _, f := range foreign {
		if size <= limit {
			break
		}
		delete(h, f.name)
		size -= f.size
		dropped = append(dropped, f.name)
	}
	list := strings.Join(dropped, ",")
	for len(list) > maxDroppedBytes {
		// Whole names only: drop the last until the list fits.
		list = list[:strings.LastIndexByte(list[:maxDroppedBytes+1], ',')+1]
		list = strings.TrimSuffix(list, ",")
	}
	h[HeaderDroppedHeaders] = list
}

// tableSize is the size of h encoded as an AMQP field table (the 4-byte
// length and the fields), as amqp091-go writes it.
func tableSize(h amqp.Table) int {
	n := 4
	for k, v := range h {
		n += fieldSize(k, v)
	}
	return n
}

// fieldSize is the encoded size of one field of a table: its name and its
// typed value.
func fieldSize(k string, v any) int { return 1 + len(k) + valueSize(v) }

// valueSize is the encoded size of a field value with its type byte.
func valueSize(v any) int {
	switch x := v.(type) {
	case bool, byte, int8:
		return 2
	case int16:
		return 3
	case int, int32, float32:
		return 5
	case int64, float64, time.Time:
		return 9
	case amqp.Decimal:
		return 6
	case string:
		return 5 + len(x)
	case []byte:
		return 5 + len(x)
	case amqp.Table:
		return 1 + tableSize(x)
	case []any:
		n := 5
		for _, e := range x {
			n += valueSize(e)
		}
		return n
	case nil:
		return 1
	}
	return 1 // a type the client refuses to encode anyway
}
