package main

import (
	"bytes"
	"errors"
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// redactor is the command's stderr: it replaces every secret the configuration named
// (passwords in URLs, keys in connection strings, tokens) with "xxxxx", whatever prints it —
// our messages, a driver's error, a relay's log line.
type redactor struct {
	w       io.Writer
	mu      sync.Mutex
	secrets []string
}

const redacted = "xxxxx"

// add records secrets; empty ones and the placeholder itself are ignored. Each is recorded
// as given and in its percent-encoded and percent-decoded forms, so that a driver that
// prints it either way is caught.
func (r *redactor) add(secrets ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range secrets {
		forms := []string{s, url.QueryEscape(s), url.PathEscape(s)}
		if dec, err := url.PathUnescape(s); err == nil {
			forms = append(forms, dec)
		}
		if dec, err := url.QueryUnescape(s); err == nil {
			forms = append(forms, dec)
		}
		for _, f := range forms {
			if f != "" && f != redacted && !slices.Contains(r.secrets, f) {
				r.secrets = append(r.secrets, f)
			}
		}
	}
	// The longest first: a secret that holds another is replaced whole.
	slices.SortStableFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
}

// sensitiveParam reports whether a URL query parameter or connection-string field holds a
// secret.
func sensitiveParam(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "key", "token", "sig", "credential", "auth"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// tokenSchemes are the URL schemes whose user-info without a password is a token, not a
// user name (nats://TOKEN@host).
var tokenSchemes = map[string]bool{"nats": true, "tls": true}

var schemeRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// addAny records the secrets that raw may hold, whatever its form — a URL (user-info of
// any shape, with characters that should have been percent-encoded; sensitive query
// parameters, and URLs nested in them), a keyword/value connection string (host=… password=…)
// or a Name=value;Name=value one — without needing it to parse. It runs before anything
// reads raw, so that no error about it can print a secret.
func (r *redactor) addAny(raw string) {
	r.add(secretsIn(raw, 0)...)
}

func secretsIn(raw string, depth int) []string {
	raw = strings.TrimSpace(raw)
	if raw == "" || depth > 3 {
		return nil
	}
	var out []string
	rest := raw
	scheme, after, hasScheme := strings.Cut(raw, "://")
	if hasScheme && schemeRe.MatchString(scheme) {
		rest = after
	} else {
		hasScheme = false
	}
	// User-info ends at the last '@': a password may hold '/', '?', '#' or '@' unencoded.
	if at := strings.LastIndex(rest, "@"); at >= 0 && (hasScheme || !looksLikeKeywords(raw)) {
		info := rest[:at]
		if _, pass, ok := strings.Cut(info, ":"); ok {
			out = append(out, pass)
		} else if tokenSchemes[strings.ToLower(scheme)] {
			out = append(out, info)
		}
		rest = rest[at+1:]
	}
	// Fields: URL query parameters, keyword/value pairs, Name=value; pairs.
	fields := rest
	if hasScheme {
		_, fields, _ = strings.Cut(rest, "?")
	}
	for _, f := range fieldsOf(fields) {
		if sensitiveParam(f.name) {
			out = append(out, f.value)
		}
		if v, err := url.QueryUnescape(f.value); err == nil && (strings.Contains(v, "://") || strings.Contains(v, "@")) {
			out = append(out, secretsIn(v, depth+1)...)
		}
	}
	return out
}

// field is one name=value pair of a connection string or a query.
type field struct{ name, value string }

// fieldsOf reads name=value fields separated by '&', ';' or white space, a value quoted
// with single quotes (libpq's keyword/value form) or bare, as written.
func fieldsOf(s string) []field {
	var out []field
	for {
		s = strings.TrimLeft(s, " \t\r\n&;")
		name, rest, ok := strings.Cut(s, "=")
		if !ok {
			return out
		}
		if i := strings.LastIndexAny(name, " \t\r\n&;"); i >= 0 {
			name = name[i+1:]
		}
		rest = strings.TrimLeft(rest, " \t")
		var value string
		if strings.HasPrefix(rest, "'") {
			var b strings.Builder
			i := 1
			for ; i < len(rest) && rest[i] != '\''; i++ {
				if rest[i] == '\\' && i+1 < len(rest) {
					i++
				}
				b.WriteByte(rest[i])
			}
			value, s = b.String(), rest[min(i+1, len(rest)):]
		} else {
			end := strings.IndexAny(rest, " \t\r\n&;")
			if end < 0 {
				end = len(rest)
			}
			value, s = rest[:end], rest[end:]
		}
		out = append(out, field{strings.TrimSpace(name), value})
	}
}

var keywordsRe = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*\s*=`)

// looksLikeKeywords reports whether s is a keyword/value connection string
// ("host=db user=app password=…"), not a URL or a file path.
func looksLikeKeywords(s string) bool {
	return !strings.Contains(s, "://") && keywordsRe.MatchString(s)
}

// redactKeywords returns a keyword/value connection string with the values of its
// sensitive fields replaced, as "name=value" pairs in their order.
func redactKeywords(s string) string {
	var parts []string
	for _, f := range fieldsOf(s) {
		if sensitiveParam(f.name) {
			f.value = redacted
		}
		parts = append(parts, f.name+"="+f.value)
	}
	return strings.Join(parts, " ")
}

// addConnectionString records the sensitive fields of a "Name=value;Name=value" string
// (Azure Storage's AccountKey, SharedAccessSignature).
func (r *redactor) addConnectionString(s string) { r.addAny(s) }

// redactURL returns u as text without its password, a token in its user-info, or its
// sensitive query parameters.
func redactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		if _, ok := c.User.Password(); ok {
			c.User = url.UserPassword(c.User.Username(), redacted)
		} else if tokenSchemes[strings.ToLower(c.Scheme)] {
			c.User = url.User(redacted)
		}
	}
	q := c.Query()
	changed := false
	for name := range q {
		if sensitiveParam(name) {
			q.Set(name, redacted)
			changed = true
		}
	}
	if changed {
		c.RawQuery = q.Encode()
	}
	return c.String()
}

// redact returns s with every recorded secret replaced.
func (r *redactor) redact(s string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, secret := range r.secrets {
		s = strings.ReplaceAll(s, secret, redacted)
	}
	return s
}

func (r *redactor) Write(p []byte) (int, error) {
	r.mu.Lock()
	out := p
	for _, secret := range r.secrets {
		out = bytes.ReplaceAll(out, []byte(secret), []byte(redacted))
	}
	r.mu.Unlock()
	if _, err := r.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// hide returns err with the recorded secrets replaced in its text; errors.Is and As still
// see what it wraps.
func (r *redactor) hide(err error) error {
	if err == nil {
		return nil
	}
	return hiddenError{msg: r.redact(err.Error()), err: err}
}

type hiddenError struct {
	msg string
	err error
}

func (e hiddenError) Error() string { return e.msg }
func (e hiddenError) Unwrap() error { return e.err }

// urlHint is what to say about a URL that does not parse or parses ambiguously: none of
// its text, since a password's pieces would be in it.
const urlHint = "percent-encode the characters / ? # @ : in a user name or password (%2F %3F %23 %40 %3A) and @ elsewhere (%40)"

// parseURL parses raw, a URL holding credentials, without ever printing any of it: an
// error says what is wrong in general terms. A URL with an '@' after its host is refused:
// url.Parse would take a password's unencoded '/', '?' or '#' for the end of the user-info,
// and the rest of the password for a host, port, path or query that gets printed.
func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("not a valid URL: " + urlHint)
	}
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if strings.LastIndex(rest, "@") > end {
			return nil, errors.New("the URL has an '@' after its host: " + urlHint)
		}
	}
	return u, nil
}
