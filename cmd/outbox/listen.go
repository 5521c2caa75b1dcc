package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// This file is what the console (serve) and the relay's health and metrics listener share:
// where they listen and who may reach them. The rules, in docs/security.md: loopback by
// default; any other address needs credentials, and TLS or an explicit --allow-plain-http;
// a request must name an allowed host (a DNS-rebinding page names its own); a browser's
// cross-site request that is not a navigation is refused; failed logins are throttled.

// listenFlags are a listener's flags.
type listenFlags struct {
	addr             string
	tlsCert, tlsKey  string
	allowedHosts     stringsFlag
	allowPlainHTTP   bool
	credentialsNamed string // the environment variables that hold credentials, for messages
}

// add registers the flags on fs; addr is the default address.
func (f *listenFlags) add(fs *flag.FlagSet, addr, what string) {
	fs.StringVar(&f.addr, "listen", addr, what+"; loopback by default. Any other address needs credentials ("+f.credentialsNamed+
		") and TLS (--tls-cert, --tls-key) or --allow-plain-http")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "serve HTTPS with this certificate (PEM `file`, the chain after the leaf); needs --tls-key")
	fs.StringVar(&f.tlsKey, "tls-key", "", "the certificate's private key (PEM `file`)")
	fs.Var(&f.allowedHosts, "allowed-host", "a host `name` requests may be addressed to, besides localhost, IP addresses and the --listen host (repeat it): the name a reverse proxy or people use")
	fs.BoolVar(&f.allowPlainHTTP, "allow-plain-http", false, "serve plain HTTP on an address that is not loopback: only behind a proxy or mesh that terminates TLS")
}

// credentials are a listener's optional authentication, from the environment: a bearer
// token, or a user and password (basic auth), or both.
type credentials struct {
	token, user, password string
}

// Minimum lengths: long enough that the throttle makes guessing hopeless.
const (
	minTokenLength    = 32
	minPasswordLength = 16
)

// readCredentials reads the credentials in the environment variables PREFIX_TOKEN,
// PREFIX_USER and PREFIX_PASSWORD, and checks them; an error names the variables, never
// their values.
func (a *app) readCredentials(prefix string) (credentials, error) {
	c := credentials{token: a.getenv(prefix + "_TOKEN"), user: a.getenv(prefix + "_USER"), password: a.getenv(prefix + "_PASSWORD")}
	a.stderr.add(c.token, c.password)
	var errs []error
	if (c.user == "") != (c.password == "") {
		errs = append(errs, fmt.Errorf("set both %s_USER and %s_PASSWORD, or neither", prefix, prefix))
	}
	if c.token != "" && len(c.token) < minTokenLength {
		errs = append(errs, fmt.Errorf("%s_TOKEN is %d characters; it needs at least %d (openssl rand -hex 32)", prefix, len(c.token), minTokenLength))
	}
	if c.password != "" && len(c.password) < minPasswordLength {
		errs = append(errs, fmt.Errorf("%s_PASSWORD is %d characters; it needs at least %d", prefix, len(c.password), minPasswordLength))
	}
	if len(errs) > 0 {
		return c, usageError{errors.Join(errs...)}
	}
	return c, nil
}

func (c credentials) enabled() bool { return c.token != "" || c.user != "" }

func (c credentials) describe() string {
	switch {
	case c.token != "" && c.user != "":
		return "bearer token or basic"
	case c.token != "":
		return "bearer token"
	case c.user != "":
		return "basic"
	}
	return "none (loopback only)"
}

// check reports whether r carries the configured credentials, and who they name for the
// audit log ("ops", the basic-auth user, or "token"); presented says r carried
// credentials of some kind. Every comparison is of SHA-256 digests in constant time, so
// neither the time nor the result says anything of a secret's length or content.
func (c credentials) check(r *http.Request) (who string, ok, presented bool) {
	authz := r.Header.Get("Authorization")
	if authz == "" {
		return "", false, false
	}
	if got, found := strings.CutPrefix(authz, "Bearer "); found {
		return "token", c.token != "" && equal(got, c.token), true
	}
	if u, p, found := r.BasicAuth(); found {
		// Both compared, whatever the first gave: no early exit.
		userOK, passOK := equal(u, c.user), equal(p, c.password)
		return c.user, c.user != "" && userOK && passOK, true
	}
	return "", false, true
}

// equal compares a and b in constant time, whatever their lengths.
func equal(a, b string) bool {
	x, y := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(x[:], y[:]) == 1
}

// throttle limits failed logins per client address: a bucket of failedBurst attempts that
// refills one every failedRefill. While a client's bucket is empty its requests are
// refused (429) before their credentials are looked at, so guessing costs time whatever
// the answer would have been. A request that authenticates costs nothing.
type throttle struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	now     func() time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

const (
	failedBurst  = 10
	failedRefill = 6 * time.Second // 10 a minute once the burst is spent
	// maxClients bounds the table: beyond it new addresses share one bucket.
	maxClients = 10000
)

func newThrottle() *throttle {
	return &throttle{buckets: map[string]*bucket{}, now: time.Now}
}

// key is the client address of r (without port): behind a proxy, the proxy's.
func clientKey(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// get returns the client's bucket, refilled to now. Called with mu held.
func (t *throttle) get(client string) *bucket {
	now := t.now()
	refill := func(b *bucket) float64 {
		return min(failedBurst, b.tokens+now.Sub(b.at).Seconds()/failedRefill.Seconds())
	}
	b := t.buckets[client]
	if b == nil && len(t.buckets) >= maxClients {
		for k, old := range t.buckets { // forget those that are full again
			if refill(old) >= failedBurst {
				delete(t.buckets, k)
			}
		}
		if len(t.buckets) >= maxClients {
			client = "overflow"
			b = t.buckets[client]
		}
	}
	if b == nil {
		b = &bucket{tokens: failedBurst, at: now}
		t.buckets[client] = b
	}
	b.tokens, b.at = refill(b), now
	return b
}

// allow reports whether client may try to log in now.
func (t *throttle) allow(client string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.get(client).tokens >= 1
}

// failed records a failed login of client.
func (t *throttle) failed(client string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.get(client)
	b.tokens = max(0, b.tokens-1)
}

// guard is the part of a listener's handling that comes before any page or endpoint: the
// host and origin allow-list, fetch metadata, and authentication.
type guard struct {
	hosts    map[string]bool // allowed names, lower case, besides IP addresses
	creds    credentials
	throttle *throttle
	// open reports whether a request for path needs no credentials (the relay's probes).
	open func(path string) bool
	// realm, when not empty, asks browsers for basic auth.
	realm string
}

// newGuard builds the guard of the listener of flags f.
func newGuard(f *listenFlags, creds credentials) *guard {
	g := &guard{hosts: map[string]bool{"localhost": true}, creds: creds, throttle: newThrottle(), open: func(string) bool { return false }}
	if host, _, err := net.SplitHostPort(f.addr); err == nil && host != "" {
		g.hosts[normalHost(host)] = true
	}
	for _, h := range f.allowedHosts {
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		g.hosts[normalHost(h)] = true
	}
	return g
}

func normalHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
}

// allowsHost reports whether a request may be addressed to hostport (a Host header or an
// Origin's host). IP addresses always may: a DNS-rebinding page is served under a name of
// its own, which then resolves to this machine, and that name is what it sends.
func (g *guard) allowsHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = normalHost(host)
	if net.ParseIP(host) != nil {
		return true
	}
	return g.hosts[host]
}

// admit checks r before any handler runs. It answers and returns false when r is refused;
// who is the authenticated caller ("" without credentials).
func (g *guard) admit(w http.ResponseWriter, r *http.Request) (who string, ok bool) {
	if r.Host != "" && !g.allowsHost(r.Host) {
		http.Error(w, "outbox: this host name is not allowed (a page under another name must not read this server); "+
			"if it is yours, add it with --allowed-host", http.StatusMisdirectedRequest)
		return "", false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		if u, err := url.Parse(o); err != nil || !g.allowsHost(u.Host) {
			http.Error(w, "outbox: requests from this origin are not allowed", http.StatusForbidden)
			return "", false
		}
	}
	// A browser says where a request comes from: another site's page may link here
	// (a navigation), but not load anything (an image, a script, a fetch) that costs this
	// server work on the user's behalf.
	// Another port of localhost is the same site, not the same origin: refused as well.
	site := r.Header.Get("Sec-Fetch-Site")
	if site != "" && site != "same-origin" && site != "none" && (r.Header.Get("Sec-Fetch-Mode") != "navigate" || r.Method != http.MethodGet) {
		http.Error(w, "outbox: requests from other sites are refused, but for links", http.StatusForbidden)
		return "", false
	}
	if !g.creds.enabled() || g.open(r.URL.Path) {
		return "", true
	}
	client := clientKey(r)
	if !g.throttle.allow(client) {
		w.Header().Set("Retry-After", fmt.Sprint(int(failedRefill.Seconds())))
		http.Error(w, "outbox: too many failed logins; try again later", http.StatusTooManyRequests)
		return "", false
	}
	who, ok, presented := g.creds.check(r)
	if ok {
		return who, true
	}
	if presented {
		g.throttle.failed(client)
	}
	if g.realm != "" && g.creds.user != "" {
		w.Header().Set("WWW-Authenticate", `Basic realm="`+g.realm+`", charset="UTF-8"`)
	}
	http.Error(w, "authentication required", http.StatusUnauthorized)
	return "", false
}

// listen opens the listener of f, after the rules of docs/security.md: loopback needs
// nothing; any other address needs creds, and TLS or --allow-plain-http. An address given
// as an IP is checked before anything listens on it.
func (f *listenFlags) listen(creds credentials) (net.Listener, *tls.Config, error) {
	var tlsConfig *tls.Config
	switch {
	case f.tlsCert != "" && f.tlsKey != "":
		cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, nil, usagef("--tls-cert, --tls-key: %v", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	case f.tlsCert != "" || f.tlsKey != "":
		return nil, nil, usagef("--tls-cert and --tls-key go together")
	}
	check := func(ip net.IP) error {
		if ip.IsLoopback() {
			return nil
		}
		if !creds.enabled() {
			return usagef("--listen %s is not a loopback address: anyone who reaches it would read the outbox; set %s first", f.addr, f.credentialsNamed)
		}
		if tlsConfig == nil && !f.allowPlainHTTP {
			return usagef("--listen %s is not a loopback address: the credentials would cross the network in clear; give --tls-cert and --tls-key, "+
				"or put a TLS-terminating proxy in front and add --allow-plain-http (docs/security.md)", f.addr)
		}
		return nil
	}
	host, _, err := net.SplitHostPort(f.addr)
	if err != nil {
		return nil, nil, usagef("--listen %s: %v", f.addr, err)
	}
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil || host == "" {
		if host == "" {
			ip = net.IPv4zero
		}
		if err := check(ip); err != nil {
			return nil, nil, err
		}
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return nil, nil, usagef("--listen %s: %v", f.addr, err)
	}
	if err := check(ln.Addr().(*net.TCPAddr).IP); err != nil {
		ln.Close()
		return nil, nil, err
	}
	return ln, tlsConfig, nil
}

// httpServer is a started listener's server.
type httpServer struct {
	srv  *http.Server
	url  string // http(s)://addr
	errc chan error
}

// serveHTTP serves h on ln (with TLS when tlsConfig is set) until stop.
func serveHTTP(ln net.Listener, tlsConfig *tls.Config, h http.Handler, srv *http.Server, log *slog.Logger) *httpServer {
	srv.Handler = h
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	s := &httpServer{srv: srv, url: "http://" + ln.Addr().String(), errc: make(chan error, 1)}
	if tlsConfig != nil {
		srv.TLSConfig = tlsConfig
		ln = tls.NewListener(ln, tlsConfig)
		s.url = "https://" + strings.TrimPrefix(s.url, "http://")
	}
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.errc <- err
	}()
	return s
}

// stop shuts the server down, letting requests in flight finish for up to 5 s.
func (s *httpServer) stop(ctx context.Context) error {
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(shutdown)
}
