package outboxtest

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/txoutbox/outbox"
)

// HeaderLines spells headers as one string, a "name\tvalue" line each, for a transport's
// decoder fuzz test: fuzz targets take no maps.
func HeaderLines(h map[string]string) string {
	var b strings.Builder
	for k, v := range h {
		b.WriteString(k + "\t" + v + "\n")
	}
	return b.String()
}

// ParseHeaderLines reads fuzz input spelled as HeaderLines writes it: each line with a tab
// is a header name and value, in order (a name may come twice); other lines are ignored.
func ParseHeaderLines(s string) [][2]string {
	var out [][2]string
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, "\t"); ok {
			out = append(out, [2]string{k, v})
		}
	}
	return out
}

// CheckMalformed reports how err, a transport's error for a broker message it could not
// decode, fails the contract of [outbox.Delivery.Message] (nil if it does not): it must be
// an *outbox.MalformedError keeping the message as received — these attributes and body,
// byte for byte, and this broker message ID.
func CheckMalformed(err error, attributes map[string]string, body []byte, brokerMessageID string) error {
	var me *outbox.MalformedError
	if !errors.As(err, &me) || !errors.Is(err, outbox.ErrMalformed) {
		return fmt.Errorf("error %v (%T) is not an *outbox.MalformedError", err, err)
	}
	if !maps.Equal(me.Attributes, attributes) || !bytes.Equal(me.Body, body) || me.BrokerMessageID != brokerMessageID {
		return fmt.Errorf("the error keeps attributes %q, body %q, broker message ID %q; received %q, %q, %q",
			me.Attributes, me.Body, me.BrokerMessageID, attributes, body, brokerMessageID)
	}
	return nil
}
