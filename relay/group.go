package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/txoutbox/outbox"
	"github.com/txoutbox/outbox/internal/config"
	"github.com/txoutbox/outbox/outboxdriver"
)

// Outbox is one outbox that a [Group] serves: its store (a schema in a shared database, or
// a database of its own), the Sender its events go to, and its relay's Config.
type Outbox struct {
	// Name identifies the outbox in the group: Remove, State and Wake take it, it is the
	// txoutbox.outbox attribute of its relay's metrics and spans, and its logs carry it.
	// 1 to 64 letters, digits and . _ - : /; unique in the group.
	Name string
	// Store and Sender are the relay's, as for [New].
	Store  outboxdriver.Store
	Sender outbox.Sender
	// Config configures the outbox's relay as for [New] (nil: the defaults). An empty Name
	// becomes the group's name, "/", and the outbox's name; a nil Logger the group's.
	Config *Config
	// Weight is how many of the group's turns the outbox takes in a row when others wait
	// (see GroupConfig.MaxCycles). Default 1: every busy outbox gets the same share.
	Weight int
}

// GroupConfig configures a [Group]. The zero value (or nil) means the defaults below.
type GroupConfig struct {
	// Name prefixes the names of the group's relays ("<Name>/<outbox>"), in leases and
	// logs. Default: host name, process ID and a random suffix, as Config.Name.
	Name string
	// MaxCycles is how many claim → send → write-back cycles the group's relays run at
	// once, all outboxes together: it bounds the group's database connections in use and
	// its concurrent sends, whatever the number of outboxes. A cycle that ends hands its
	// turn to the next outbox in line, round-robin (Outbox.Weight turns in a row), so a
	// busy outbox takes at most its share and a quiet one waits for at most one cycle of
	// each outbox ahead of it. Probes of an outbox whose broker or database is down take no
	// turn: a dead database holds up only its own outbox. Default 8.
	MaxCycles int
	// Logger is the default logger of the group's relays, and receives the group's own
	// logs. Default slog.Default().
	Logger *slog.Logger
	// OnStateChange, when set, is called as Config.OnStateChange is, for every outbox of
	// the group, with the outbox's name (after the outbox's own OnStateChange, if any).
	OnStateChange func(ctx context.Context, outbox string, s State)
}

// WithDefaults returns a copy of c (nil allowed) with every unset field at its default.
func (c *GroupConfig) WithDefaults() *GroupConfig {
	out := GroupConfig{}
	if c != nil {
		out = *c
	}
	if out.Name == "" {
		out.Name = defaultName()
	}
	config.Default(&out.MaxCycles, 8)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// ErrUnknownOutbox is returned by [Group.Remove] for a name the group does not serve.
var ErrUnknownOutbox = errors.New("relay: no such outbox in the group")

// Group runs the relays of many outboxes in one process: schemas of one database, or
// databases of their own (database-per-tenant). Each outbox has a [Relay] of its own, so it
// keeps every guarantee of one — per-key order, leases and fencing, retries, dead letters,
// held keys — and its own availability: a database or broker that is down pauses only the
// outboxes that use it. The relays share a limit of concurrent cycles (GroupConfig.MaxCycles),
// handed round-robin, so that a busy outbox cannot starve a quiet one and fifty outboxes
// do not hold fifty times the connections of one.
//
// Add and Remove change the outboxes at any time, before or while Run runs.
type Group struct {
	cfg   *GroupConfig
	share *fairShare

	mu      sync.Mutex
	members map[string]*member
	ctx     context.Context // Run's, nil while Run does not run
	wg      sync.WaitGroup  // the relays' Run calls
}

// member is one outbox of a group.
type member struct {
	name   string
	relay  *Relay
	cancel context.CancelFunc // ends its Run; nil while it does not run
	done   chan struct{}      // closed when its Run returned
	err    error              // why its Run stopped on its own (set before done closes)
}

// NewGroup returns a group with no outbox; Add adds them. It applies cfg's defaults (nil
// means the defaults).
func NewGroup(cfg *GroupConfig) (*Group, error) {
	c := cfg.WithDefaults()
	if c.MaxCycles < 1 || c.MaxCycles > 4096 {
		return nil, fmt.Errorf("relay: invalid GroupConfig: MaxCycles %d is outside 1..4096", c.MaxCycles)
	}
	return &Group{cfg: c, share: newFairShare(c.MaxCycles), members: map[string]*member{}}, nil
}

// validOutboxName reports whether name may name an outbox of a group.
func validOutboxName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("relay: outbox name %q must have 1 to 64 characters", cut(name))
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' || r == ':' || r == '/'
		if !ok {
			return fmt.Errorf("relay: outbox name %q may hold only letters, digits and . _ - : /", cut(name))
		}
	}
	return nil
}

// cut shortens s for an error message.
func cut(s string) string {
	if len(s) > 70 {
		return s[:70] + "…"
	}
	return s
}

// Add adds an outbox to the group and, while Run runs, starts its relay. It fails, adding
// nothing, when the name is invalid or taken or the relay's arguments are (as for [New]).
func (g *Group) Add(o Outbox) error {
	var errs []error
	if err := validOutboxName(o.Name); err != nil {
		errs = append(errs, err)
	}
	if o.Weight < 0 || o.Weight > 100 {
		errs = append(errs, fmt.Errorf("relay: outbox %q: Weight %d is outside 0..100", cut(o.Name), o.Weight))
	}
	cfg := Config{}
	if o.Config != nil {
		cfg = *o.Config
	}
	if cfg.Name == "" {
		cfg.Name = g.cfg.Name + "/" + o.Name
	}
	if cfg.Logger == nil {
		cfg.Logger = g.cfg.Logger
	}
	cfg.Logger = cfg.Logger.With("outbox", o.Name)
	cfg.outbox = o.Name
	if own, all := cfg.OnStateChange, g.cfg.OnStateChange; all != nil {
		cfg.OnStateChange = func(ctx context.Context, s State) {
			if own != nil {
				own(ctx, s)
			}
			all(ctx, o.Name, s)
		}
	}
	r, err := New(o.Store, o.Sender, &cfg)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	r.turns = g.share.member(o.Weight)
	m := &member{name: o.Name, relay: r}

	g.mu.Lock()
	defer g.mu.Unlock()
	if _, taken := g.members[o.Name]; taken {
		return fmt.Errorf("relay: the group already serves an outbox named %q", o.Name)
	}
	g.members[o.Name] = m
	if g.ctx != nil {
		g.start(m)
	}
	return nil
}

// start runs m's relay until the group's Run ends or m is removed (g.mu held, Run running).
func (g *Group) start(m *member) {
	ctx, cancel := context.WithCancel(g.ctx)
	m.cancel, m.done, m.err = cancel, make(chan struct{}), nil
	done := m.done
	g.wg.Go(func() {
		defer close(done)
		defer cancel()
		if err := m.relay.Run(ctx); err != nil {
			g.mu.Lock()
			m.err = err
			g.mu.Unlock()
			g.cfg.Logger.Error("outbox relay: an outbox of the group stopped; the others go on", "outbox", m.name, "err", err)
		}
	})
}

// Remove stops the relay of the outbox called name and takes it out of the group. It
// returns once the relay's Run returned — its batch in flight sent and written back, or
// released — or when ctx ends first (the relay still stops, and the group's Run waits
// for it). It returns [ErrUnknownOutbox] for a name the group does not serve.
func (g *Group) Remove(ctx context.Context, name string) error {
	g.mu.Lock()
	m, ok := g.members[name]
	var cancel context.CancelFunc
	var done chan struct{}
	if ok {
		delete(g.members, name)
		cancel, done = m.cancel, m.done
	}
	g.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownOutbox, cut(name))
	}
	if cancel == nil {
		return nil // it does not run
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("relay: removing outbox %q: %w", name, ctx.Err())
	}
}

// Run runs the relays of the group's outboxes, and of those added meanwhile, until ctx
// ends; then it returns nil once every relay's Run has returned (see [Relay.Run]). An
// outbox whose relay stops on its own (its schema is not migrated: an error wrapping
// [outbox.ErrSchema]) stops alone: its State says why, and the others go on. It returns
// an error if the group is already running.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.ctx != nil {
		g.mu.Unlock()
		return errors.New("relay: Group.Run called while the group is running")
	}
	g.ctx = ctx
	for _, m := range g.members {
		g.start(m)
	}
	g.mu.Unlock()
	<-ctx.Done()
	g.mu.Lock()
	g.ctx = nil
	g.mu.Unlock()
	g.wg.Wait()
	g.mu.Lock()
	for _, m := range g.members {
		m.cancel = nil
	}
	g.mu.Unlock()
	return nil
}

// Names returns the names of the group's outboxes, sorted.
func (g *Group) Names() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Sorted(maps.Keys(g.members))
}

// Wake makes the relay of the outbox called name claim now (see [Relay.Wake]); it does
// nothing for a name the group does not serve.
func (g *Group) Wake(name string) {
	g.mu.Lock()
	m := g.members[name]
	g.mu.Unlock()
	if m != nil {
		m.relay.Wake()
	}
}

// OutboxState is the state of one outbox of a [Group].
type OutboxState struct {
	// State is its relay's (see [Relay.State]).
	State
	// Stopped is why its relay stopped on its own while the group runs (its schema is not
	// migrated); nil otherwise.
	Stopped error
	// Cycles counts the group's turns (GroupConfig.MaxCycles) that it holds now.
	Cycles int
}

// Healthy reports whether the outbox's relay runs with its broker and database available.
func (s OutboxState) Healthy() bool { return s.Stopped == nil && s.State.Healthy() }

// State returns the state of the outbox called name, and false if the group serves none.
func (g *Group) State(name string) (OutboxState, bool) {
	g.mu.Lock()
	m := g.members[name]
	var stopped error
	if m != nil {
		stopped = m.err
	}
	g.mu.Unlock()
	if m == nil {
		return OutboxState{}, false
	}
	_, cycles := g.share.inUse(m.relay.turns)
	return OutboxState{State: m.relay.State(), Stopped: stopped, Cycles: cycles}, true
}

// States returns the state of every outbox of the group, by name.
func (g *Group) States() map[string]OutboxState {
	out := map[string]OutboxState{}
	for _, name := range g.Names() {
		if s, ok := g.State(name); ok {
			out[name] = s
		}
	}
	return out
}

// Cycles returns how many of the group's turns (GroupConfig.MaxCycles) are held now.
func (g *Group) Cycles() int {
	all, _ := g.share.inUse(nil)
	return all
}
