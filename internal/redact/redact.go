// Package redact hides the credentials of URLs in log lines and errors:
// the one rule every flag and option that takes a URL follows
// (--redis-url, --amqp-url, --redis.url, --rabbitmq.url,
// --alertmanager.url, the management API's URL, …).
//
//	redact.URL("redis://app:s3cret@cache:6379/0")  // redis://app:xxxxx@cache:6379/0
//	redact.URL("redis://app:50%off@cache:6379/0")  // redis://<unparseable URL redacted>
//	return fmt.Errorf("--redis.url: %w", redact.Error(err, rawURL))
//
// A URL that does not parse is never shown, not even in part: a password
// with an unescaped %, space, / or # is exactly what makes it unparseable,
// and net/url's own error quotes the URL and the bad escape.
package redact

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// Mask replaces a password (or a user name that stands alone, which
// go-redis takes for a password) in a URL that parses.
const Mask = "xxxxx"

// Unparseable replaces everything but the scheme of a URL that does not
// parse.
const Unparseable = "<unparseable URL redacted>"

// hint follows a URL that does not parse in an error, instead of
// net/url's own message (which quotes part of the password).
const hint = "not a valid URL: percent-encode the special characters of its user and password (% as %25, space as %20, @ as %40, : as %3A, / as %2F, ? as %3F, # as %23)"

// URL returns s fit for a log line or an error message.
//
// A URL that parses is shown with its password replaced by Mask
// (redis://app:xxxxx@cache:6379/0); a user name without a password is
// replaced too (redis://xxxxx@cache:6379), since some clients (go-redis)
// take it for the password. A URL without credentials is returned as it
// is. A string that does not parse, or whose "@" lies outside the host
// part (a password holding an unescaped /, ? or #), shows only its scheme:
// redis://<unparseable URL redacted>, or Unparseable alone when it has
// none. The empty string stays empty.
func URL(s string) string {
	if s == "" {
		return ""
	}
	u, ok := parse(s)
	switch {
	case !ok:
		if scheme, _, found := strings.Cut(s, "://"); found && validScheme(scheme) {
			return scheme + "://" + Unparseable
		}
		return Unparseable
	case u.User == nil:
		return s
	}
	if _, has := u.User.Password(); has {
		return u.Redacted()
	}
	u.User = url.User(Mask)
	return u.String()
}

// Error returns err with its text cleared of the URLs and their
// credentials, for an error from a client library (or net/url) given
// urls. Every URL in urls is shown as URL shows it, each password (and
// lone user name) of theirs, escaped or not, as Mask; a net/url parse
// error anywhere in err's chain becomes "<URL(its URL)>: not a valid URL:
// percent-encode …", without net/url's own detail. A nil err stays nil;
// an err whose text holds no secret is returned as it is.
//
// # Notes
//
// The returned error does not unwrap: errors.Is still works through it
// (errors.Is(err, context.Canceled)), but errors.As and errors.Unwrap
// cannot reach the original text.
func Error(err error, urls ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) && ue.Op == "parse" {
		msg = strings.ReplaceAll(msg, ue.Error(), URL(ue.URL)+": "+hint)
		urls = append(urls, ue.URL)
	}
	msg = scrub(msg, urls)
	if msg == err.Error() {
		return err
	}
	return &redacted{msg: msg, err: err}
}

// redacted is an error whose text was cleared of secrets. It answers
// errors.Is for the original but does not unwrap to it.
type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }

// Is reports whether the original error is target.
func (e *redacted) Is(target error) bool { return errors.Is(e.err, target) }

// scrub replaces in msg each of urls by its redacted form, then each of
// their secrets by Mask, in their plain and their Go-quoted (%q) forms.
func scrub(msg string, urls []string) string {
	for _, s := range urls {
		if s == "" {
			continue
		}
		safe := URL(s)
		for _, form := range forms(s) {
			msg = strings.ReplaceAll(msg, form, safe)
		}
		for _, secret := range secrets(s) {
			for _, form := range forms(secret) {
				msg = strings.ReplaceAll(msg, form, Mask)
			}
		}
	}
	return msg
}

// forms returns s and, when it differs, s as it appears inside a
// Go-quoted string (%q).
func forms(s string) []string {
	q := strconv.Quote(s)
	if q = q[1 : len(q)-1]; q != s {
		return []string{s, q}
	}
	return []string{s}
}

// secrets returns what of s must never be shown: the password (or a lone
// user name) as written and decoded; for a string that does not parse,
// everything between "//" and the last "@", and its part after the first
// ":".
func secrets(s string) []string {
	u, ok := parse(s)
	if ok && u.User == nil {
		return nil
	}
	_, rest, found := strings.Cut(s, "//")
	if !found {
		rest = s
	}
	if ok { // the userinfo lies in the host part, before its first /, ? or #
		if end := strings.IndexAny(rest, "/?#"); end >= 0 {
			rest = rest[:end]
		}
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return nil
	}
	var out []string
	add := func(v string) {
		if v == "" {
			return
		}
		out = append(out, v)
		if d, err := url.PathUnescape(v); err == nil && d != v {
			out = append(out, d)
		}
	}
	userinfo := rest[:at]
	user, pass, has := strings.Cut(userinfo, ":")
	switch {
	case !ok:
		add(userinfo)
		add(pass)
	case has:
		add(pass)
		p, _ := u.User.Password()
		add(p)
	default:
		add(user)
		add(u.User.Username())
	}
	return out
}

// parse is url.Parse, refusing as well a URL with an "@" outside its
// userinfo: a user or password holding an unescaped /, ? or # ends the
// host part early, and its rest would show as a path, query or fragment.
func parse(s string) (*url.URL, bool) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, false
	}
	if u.User == nil && strings.Contains(s, "@") {
		return nil, false
	}
	return u, true
}

// validScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, +, - or .).
func validScheme(s string) bool {
	for i, c := range s {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}
