package claimcheck

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/txoutbox/outbox"
)

// SenderConfig configures [NewSender].
type SenderConfig struct {
	// Store keeps the bodies. Required.
	Store BlobStore
	// Threshold is the largest body, in bytes, sent as it is; larger ones go to Store
	// before sending. Default: the wrapped Sender's limit when it declares one ([Limiter]),
	// else none. Either way, a message the wrapped Sender refuses as too large (an error
	// wrapping [outbox.ErrTooLarge]) goes to Store and is sent again in the same call, so a
	// threshold only saves that first, refused attempt.
	Threshold int
}

// Limiter is an optional interface of an [outbox.Sender] that declares its size limit:
// the largest message it sends, in bytes (outboxazqueue's encoded document, outboxsqs's
// MaxMessageBytes). [NewSender] takes it as its default threshold.
type Limiter interface {
	MaxMessageBytes() int
}

// sender is the claim-check Sender; NewSender adds the wrapped Sender's Ping and
// Describer methods where it has them.
type sender struct {
	next      outbox.Sender
	store     BlobStore
	threshold int
}

// NewSender returns a Sender that sends through next, putting the bodies of messages over
// cfg's threshold, or refused by next as too large, in cfg.Store and sending their
// reference instead (see the package documentation). It keeps next's promises: it is an
// [outbox.KeyOrderer] when next is one, and an [outbox.Pinger] and [outbox.Describer] when
// next is. A blob that cannot be written fails its message with an error marked
// [outbox.Unavailable] (the relay pauses and spends no attempt), and the later messages of
// its key in the same call are not sent either.
func NewSender(next outbox.Sender, cfg *SenderConfig) (outbox.Sender, error) {
	var errs []error
	if next == nil {
		errs = append(errs, errors.New("NewSender needs the Sender to wrap"))
	}
	if cfg == nil || cfg.Store == nil {
		errs = append(errs, errors.New("SenderConfig.Store is required"))
	} else if cfg.Threshold < 0 {
		errs = append(errs, fmt.Errorf("SenderConfig.Threshold %d is negative", cfg.Threshold))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("claimcheck: %w", errors.Join(errs...))
	}
	s := &sender{next: next, store: cfg.Store, threshold: cfg.Threshold}
	if l, ok := next.(Limiter); ok && s.threshold == 0 {
		s.threshold = l.MaxMessageBytes()
	}
	p, pings := next.(outbox.Pinger)
	d, describes := next.(outbox.Describer)
	switch {
	case pings && describes:
		return struct {
			*sender
			outbox.Pinger
			outbox.Describer
		}{s, p, d}, nil
	case pings:
		return struct {
			*sender
			outbox.Pinger
		}{s, p}, nil
	case describes:
		return struct {
			*sender
			outbox.Describer
		}{s, d}, nil
	}
	return s, nil
}

// KeepsKeyOrder forwards the wrapped Sender's answer: a claim-checked message takes its
// place in the call it came in.
func (s *sender) KeepsKeyOrder() bool { return outbox.KeepsKeyOrder(s.next) }

// Send implements [outbox.Sender].
func (s *sender) Send(ctx context.Context, msgs []outbox.Message) error {
	out := msgs
	failed := map[int]error{}
	for i, m := range msgs {
		if s.threshold == 0 || len(m.Body) <= s.threshold || m.Headers[Header] != "" {
			continue
		}
		if len(out) > 0 && &out[0] == &msgs[0] {
			out = append([]outbox.Message(nil), msgs...) // the caller's slice stays as it was
		}
		ref, err := s.offload(ctx, m)
		if err != nil {
			failed[i] = err
			continue
		}
		out[i] = ref
	}
	err := s.send(ctx, out, failed)
	// What the wrapped Sender refused as too large goes to the store and is sent again,
	// with the later messages of its key that were held back for it.
	var be *outbox.BatchError
	if !errors.As(err, &be) {
		return err
	}
	var again []int
	blocked := map[string]bool{}
	for i := range msgs {
		ferr, ok := be.Failed[i]
		switch {
		case !ok:
			continue
		case errors.Is(ferr, outbox.ErrTooLarge) && out[i].Headers[Header] == "" && !blocked[out[i].Key]:
			ref, oerr := s.offload(ctx, msgs[i])
			if oerr != nil {
				be.Failed[i] = oerr
				s.block(blocked, out[i].Key)
				continue
			}
			out[i] = ref
			again = append(again, i)
		case out[i].Key != "" && !blocked[out[i].Key] && tooLargeBefore(be, out, i):
			again = append(again, i) // held back behind a too-large message of its key
		default:
			s.block(blocked, out[i].Key)
		}
	}
	if len(again) == 0 {
		return err
	}
	for _, i := range again {
		delete(be.Failed, i)
	}
	s.sendSome(ctx, out, again, be.Failed)
	if len(be.Failed) == 0 {
		return nil
	}
	return be
}

// block marks key as one whose later messages must not be sent again in this call.
func (s *sender) block(blocked map[string]bool, key string) {
	if key != "" {
		blocked[key] = true
	}
}

// tooLargeBefore reports whether an earlier message of out[i]'s key failed as too
// large: the wrapped KeyOrderer then held out[i] back without sending it.
func tooLargeBefore(be *outbox.BatchError, out []outbox.Message, i int) bool {
	for j := i - 1; j >= 0; j-- {
		if out[j].Key != out[i].Key {
			continue
		}
		if ferr, ok := be.Failed[j]; ok && errors.Is(ferr, outbox.ErrTooLarge) {
			return true
		}
	}
	return false
}

// send sends out but the messages that already failed (and the later messages of their
// keys), and returns every failure by index in out.
func (s *sender) send(ctx context.Context, out []outbox.Message, failed map[int]error) error {
	if len(failed) == 0 {
		err := s.next.Send(ctx, out)
		if err != nil && len(out) == 1 && !errors.As(err, new(*outbox.BatchError)) && errors.Is(err, outbox.ErrTooLarge) {
			return &outbox.BatchError{Failed: map[int]error{0: err}}
		}
		return err
	}
	blocked := map[string]string{}
	var idx []int
	for i, m := range out {
		if _, ok := failed[i]; ok {
			if m.Key != "" && blocked[m.Key] == "" {
				blocked[m.Key] = m.ID.String()
			}
			continue
		}
		if first := blocked[m.Key]; m.Key != "" && first != "" {
			failed[i] = outbox.Unavailable(fmt.Errorf("claimcheck: message %s not sent: message %s of its key %q before it could not be claim-checked", m.ID, first, m.Key))
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) > 0 {
		s.sendSome(ctx, out, idx, failed)
	}
	return &outbox.BatchError{Failed: failed}
}

// sendSome sends the messages of out at indexes idx, in that order, and records each one
// that failed in failed, by its index in out.
func (s *sender) sendSome(ctx context.Context, out []outbox.Message, idx []int, failed map[int]error) {
	sub := make([]outbox.Message, len(idx))
	for j, i := range idx {
		sub[j] = out[i]
	}
	err := s.next.Send(ctx, sub)
	var be *outbox.BatchError
	switch {
	case err == nil:
	case errors.As(err, &be):
		for j, e := range be.Failed {
			failed[idx[j]] = e
		}
	default:
		for _, i := range idx {
			failed[i] = err
		}
	}
}

// offload puts m's body in the store and returns the message that refers to it.
func (s *sender) offload(ctx context.Context, m outbox.Message) (outbox.Message, error) {
	key := Key(m.ID)
	if err := s.store.Put(ctx, key, m.Body); err != nil {
		if ctx.Err() != nil {
			return outbox.Message{}, err
		}
		return outbox.Message{}, outbox.Unavailable(fmt.Errorf("claimcheck: message %s (%d bytes): writing its blob: %w", m.ID, len(m.Body), err))
	}
	ref := m
	ref.Body = nil
	ref.Headers = maps.Clone(m.Headers)
	if ref.Headers == nil {
		ref.Headers = map[string]string{}
	}
	ref.Headers[Header] = s.store.Ref(key)
	return ref, nil
}
