package sqlstore

import "github.com/txoutbox/outbox/outboxdriver"

// What PostgreSQL's claim (migration 004) learns from a relay loop's claims, kept in Go per
// loop (outboxdriver.ClaimState) and passed to the next claim as arguments: the claim
// function keeps no state of its own. Only the cost of a claim depends on it, never what a
// claim may take (docs/ordering.md).

const (
	// pgProbeEvery: while a loop's claims come back full of keyed work, only every 32nd
	// probes whether the outbox holds any keyed row (step 1). The probe walks the index
	// entries of delivered keys that vacuum has not removed yet, thousands after a drain of
	// many keys (~0.3 ms a probe; skipping it drains distinct keys ~25 % faster).
	pgProbeEvery = 32
	// pgWideFor: a loop whose claim found less than 3/4 of a claim in a full window reads a
	// window of 4 × the limit instead of 2 × for its next claims, until 32 of them have
	// been filled by the window alone (few keys: the runs a concurrent claim holds fill the
	// front of the window; trying the narrow window again sooner cost a step 4 each time).
	pgWideFor = 32
)

// pgLoop is what PostgreSQL's claim remembers of one relay loop.
type pgLoop struct {
	// full counts the loop's last claims in a row that came back full of keyed work.
	full int
	// wide counts down the claims left that read the wide window.
	wide int
}

// pgLoopOf returns the loop state kept in s, creating it on the loop's first claim; a claim
// without a state (nil) gets a fresh one, as a loop's first claim.
func pgLoopOf(s *outboxdriver.ClaimState) *pgLoop { return loopOf[pgLoop](s) }

// args are the claim function's tuning arguments for a claim of limit rows: the window's
// width in rows (step 3), whether to probe for keyed rows (step 1), and whether the loop is
// in a backlog (its last claim was full: step 2 shares the partitions between the loops
// instead of taking the lock of all keys).
func (l *pgLoop) args(limit int) (window int, probe, backlog bool) {
	window = 2 * limit
	if l.wide > 0 {
		window = 4 * limit
	}
	return window, l.full%pgProbeEvery == 0, l.full > 0
}

// pgClaimSteps counts a claim's rows by the step of the claim function that leased them
// (1: the keyless queue, 3: the window, 4: beyond it).
type pgClaimSteps struct{ queue, window, beyond int }

func (s *pgClaimSteps) count(step int16) {
	switch step {
	case 1:
		s.queue++
	case 3:
		s.window++
	default:
		s.beyond++
	}
}

// learn updates l after a claim of limit rows that leased steps.
func (l *pgLoop) learn(limit int, steps pgClaimSteps) {
	n := steps.queue + steps.window + steps.beyond
	switch {
	case steps.queue > 0: // an outbox of keyless rows: nothing keyed to remember
		l.full = 0
		return
	case n >= limit:
		l.full++
	default:
		l.full = 0
	}
	switch {
	case steps.window >= limit:
		l.wide = max(l.wide-1, 0)
	case steps.window < limit*3/4 && (steps.beyond > 0 || n < limit):
		// The window left the claim short and there was more beyond it (or, for a claim
		// that came back short, may have been: a wide window over a small outbox reads
		// what a narrow one does).
		l.wide = pgWideFor
	}
}
