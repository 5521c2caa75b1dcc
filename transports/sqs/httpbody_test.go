package outboxsqs

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

type doFunc func(*http.Request) (*http.Response, error)

func (f doFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

// The body net/http sees has no WriteTo, so io.Copy reads it with Read.
func TestPlainBodyHidesWriteTo(t *testing.T) {
	var seen io.ReadCloser
	o := sqs.Options{HTTPClient: doFunc(func(r *http.Request) (*http.Response, error) {
		seen = r.Body
		return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
	})}
	withPlainBody(&o)
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/", io.NopCloser(bytes.NewReader([]byte("{}"))))
	if _, ok := req.Body.(io.WriterTo); !ok {
		t.Fatal("test body should implement io.WriterTo")
	}
	if _, err := o.HTTPClient.Do(req); err != nil {
		t.Fatal(err)
	}
	if _, ok := seen.(io.WriterTo); ok {
		t.Fatal("the body handed to the HTTP client still implements io.WriterTo")
	}
	if b, _ := io.ReadAll(seen); string(b) != "{}" {
		t.Fatalf("body %q, want {}", b)
	}
}
