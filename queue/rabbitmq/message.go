package rabbitmq

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/backstop-dev/backstop/queue"
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
)

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
	delayExchange = "backstop.delay.L"       // + level: the exchanges, and the first topology's TTL queues
	holdQueue     = "backstop.hold.L"        // + level: the queues the movers hold messages from
	deliverXchg   = "backstop.delay.deliver" // headers exchange, by destination
	enterXchg     = "backstop.delay.enter"   // topic exchange, to the highest set bit's level
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
// job: its id the message_id, or "sha256:" and the body's SHA-256 in hex
// without one; first enqueued at its timestamp property, or now without one.
func Decode(d amqp.Delivery) queue.Job {
	j := queue.Job{ID: d.MessageId, Payload: d.Body}
	h := d.Headers
	j.Type = headerString(h, HeaderJobType)
	if plain(h) {
		if j.ID == "" {
			sum := sha256.Sum256(d.Body)
			j.ID = "sha256:" + hex.EncodeToString(sum[:])
		}
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
// type and every other header kept. With stripBroker the broker's own
// headers (x-death, x-delivery-count: they describe the old place) go; a
// malformed message keeps them, for a person to read.
func next(d amqp.Delivery, set map[string]any, stripBroker bool) amqp.Publishing {
	h := copyHeaders(d.Headers)
	for _, k := range []string{"x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
		"x-last-death-exchange", "x-last-death-queue", "x-last-death-reason", "x-delivery-count"} {
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
	return amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, MessageId: d.MessageId, CorrelationId: d.CorrelationId,
		Type: d.Type, AppId: d.AppId, Timestamp: d.Timestamp, Body: d.Body,
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
