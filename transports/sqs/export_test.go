package outboxsqs

import "github.com/txoutbox/outbox"

// EncodedSize is the size SQS counts for m sent by a Sender with this source.
func EncodedSize(m outbox.Message, source string) (int, error) {
	w, err := encode(m, source)
	return w.size, err
}
