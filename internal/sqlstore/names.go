package sqlstore

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"

	"github.com/txoutbox/outbox"
)

// Names are a dialect's validated, quoted table names. The migrations are templates over
// them (Render), so the functions and lock keys they create are named here too.
type Names struct {
	Schema       string // raw, validated; "" for the connection default
	Prefix       string // raw outbox table name, prefix of the others
	Outbox       string // quoted, qualified
	DeadLetters  string
	Inbox        string
	Responses    string // the HTTP Idempotency-Key responses
	Scheduled    string // events due later (outbox.WithDeliverAt), moved into the outbox when due
	Migrations   string
	ClaimFunc    string // PostgreSQL: claim and complete functions
	CompleteFunc string
	IsFree       string // PostgreSQL: the function saying whether a row is due and not leased
	ClaimLocks   string // PostgreSQL: the function taking the claims' locks of key partitions
	WriteBacks   string // PostgreSQL: the function taking every claims' lock for a write-back
	ClaimLock    string // MySQL: the one-row table whose row lock serialises claims
	LockKey      int64  // advisory lock key of this outbox's claims (PostgreSQL: of all keys; XOR 1-16, of a key partition)
	MigrateKey   int64  // advisory lock key of this outbox's migrations
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// NewNames validates t and quotes its names for d.
func NewNames(d Dialect, t outbox.Tables) (*Names, error) {
	if t.Outbox == "" {
		t.Outbox = "outbox"
	}
	var errs []error
	if t.Schema != "" && (!identRe.MatchString(t.Schema) || len(t.Schema) > 63) {
		errs = append(errs, fmt.Errorf("outbox: schema name %q is not a plain identifier of at most 63 characters", t.Schema))
	}
	if !identRe.MatchString(t.Outbox) || len(t.Outbox) > 40 {
		errs = append(errs, fmt.Errorf("outbox: table name %q is not a plain identifier of at most 40 characters", t.Outbox))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	qual := func(name string) string {
		if t.Schema == "" {
			return d.Quote(name)
		}
		return d.Quote(t.Schema) + "." + d.Quote(name)
	}
	return &Names{
		Schema:       t.Schema,
		Prefix:       t.Outbox,
		Outbox:       qual(t.Outbox),
		DeadLetters:  qual(t.Outbox + "_dead_letters"),
		Inbox:        qual(t.Outbox + "_inbox"),
		Responses:    qual(t.Outbox + "_http_responses"),
		Scheduled:    qual(t.Outbox + "_scheduled"),
		Migrations:   qual(t.Outbox + "_migrations"),
		ClaimFunc:    qual(t.Outbox + "_claim"),
		CompleteFunc: qual(t.Outbox + "_complete"),
		IsFree:       qual(t.Outbox + "_is_free"),
		ClaimLocks:   qual(t.Outbox + "_claim_locks"),
		WriteBacks:   qual(t.Outbox + "_write_back_locks"),
		ClaimLock:    qual(t.Outbox + "_claim_lock"),
		LockKey:      lockKey(d.Name(), t.Schema, t.Outbox, "claim"),
		MigrateKey:   lockKey(d.Name(), t.Schema, t.Outbox, "migrate"),
	}, nil
}

// NamesByDialect validates t once and returns its names quoted for every dialect, keyed by
// dialect name.
func NamesByDialect(t outbox.Tables) (map[string]*Names, error) {
	out := make(map[string]*Names, len(Dialects))
	for _, d := range Dialects {
		n, err := NewNames(d, t)
		if err != nil {
			return nil, err
		}
		out[d.Name()] = n
	}
	return out, nil
}

// table returns the quoted, qualified name of n's table called name in d.
func (n *Names) table(d Dialect, name string) string {
	if n.Schema == "" {
		return d.Quote(name)
	}
	return d.Quote(n.Schema) + "." + d.Quote(name)
}

func lockKey(parts ...string) int64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return int64(h.Sum64())
}

// MustOutbox returns o, or panics with err: each adapter's Default outbox is built with it
// from the default table names, which always validate.
func MustOutbox[O any](o O, err error) O {
	if err != nil {
		panic(err)
	}
	return o
}
