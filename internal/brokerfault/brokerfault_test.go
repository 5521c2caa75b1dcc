package brokerfault

import (
	"errors"
	"io"
	"testing"

	"github.com/txoutbox/outbox"
)

func TestMark(t *testing.T) {
	broker := func(err error) bool { return errors.Is(err, io.EOF) }
	if err := Mark(nil, broker); err != nil {
		t.Errorf("Mark(nil) = %v", err)
	}
	if err := Mark(io.EOF, broker); !errors.Is(err, outbox.ErrUnavailable) || !errors.Is(err, io.EOF) {
		t.Errorf("Mark(io.EOF) = %v, want it marked, still wrapping io.EOF", err)
	}
	if marked := outbox.Unavailable(io.EOF); Mark(marked, broker) != marked {
		t.Error("an error already marked was marked again")
	}
	if err := Mark(outbox.Permanent(io.EOF), broker); outbox.IsUnavailable(err) || !outbox.IsPermanent(err) {
		t.Errorf("a permanent error became unavailable: %v", err)
	}
	if err := Mark(io.ErrUnexpectedEOF, broker); outbox.IsUnavailable(err) {
		t.Errorf("the message's error was marked: %v", err)
	}
	if !IsAny(io.EOF, io.ErrClosedPipe, io.EOF) || IsAny(io.EOF, io.ErrClosedPipe) {
		t.Error("IsAny")
	}
}
