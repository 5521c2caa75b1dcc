package main

import (
	"bytes"
	"errors"
	"io"
	"net/url"
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

// add records secrets; empty ones and the placeholder itself are ignored.
func (r *redactor) add(secrets ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range secrets {
		if s == "" || s == redacted {
			continue
		}
		r.secrets = append(r.secrets, s)
		if esc := url.QueryEscape(s); esc != s {
			r.secrets = append(r.secrets, esc)
		}
		if esc := url.PathEscape(s); esc != s {
			r.secrets = append(r.secrets, esc)
		}
	}
}

// sensitiveParam reports whether a URL query parameter or connection-string field holds a
// secret.
func sensitiveParam(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"pass", "secret", "key", "token", "sig", "credential", "auth"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// addURL records the password and the sensitive query parameters of u.
func (r *redactor) addURL(u *url.URL) {
	if p, ok := u.User.Password(); ok {
		r.add(p)
	}
	for name, vs := range u.Query() {
		if sensitiveParam(name) {
			r.add(vs...)
		}
	}
}

// addConnectionString records the sensitive fields of a "Name=value;Name=value" string
// (Azure Storage's AccountKey, SharedAccessSignature).
func (r *redactor) addConnectionString(s string) {
	for _, field := range strings.Split(s, ";") {
		name, value, ok := strings.Cut(field, "=")
		if ok && sensitiveParam(name) {
			r.add(value)
		}
	}
}

// redactURL returns u as text without its password or sensitive query parameters.
func redactURL(u *url.URL) string {
	c := *u
	if c.User != nil {
		if _, ok := c.User.Password(); ok {
			c.User = url.UserPassword(c.User.Username(), redacted)
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

// hideURLError is the error of a URL that did not parse, without the URL: its password
// could not be found to be redacted.
func (r *redactor) hideURLError(raw string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return errors.New("not a valid URL: " + r.redact(strings.ReplaceAll(ue.Err.Error(), raw, "…")))
	}
	return errors.New("not a valid URL")
}
