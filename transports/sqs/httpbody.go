package outboxsqs

import (
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// withPlainBody is passed to every SDK call. It works around a race between net/http and
// smithy-go (v1.28.8): the SDK wraps request bodies in a reader whose WriteTo returns io.EOF
// once the SDK has closed the body. When SQS answers before net/http's write loop has made
// its last read of the body, that io.EOF reaches the write loop as a write error, which
// closes the connection while the response is being read; the SDK then retries the call, so
// a SendMessageBatch is sent twice and a ReceiveMessage hides the messages of the lost
// response until their visibility timeout. Hiding WriteTo makes io.Copy use Read, whose
// io.EOF after Close is an ordinary end of body.
func withPlainBody(o *sqs.Options) {
	if o.HTTPClient != nil {
		o.HTTPClient = plainBodyClient{o.HTTPClient}
	}
}

type plainBodyClient struct{ next sqs.HTTPClient }

func (c plainBodyClient) Do(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = readCloser{r.Body}
	}
	return c.next.Do(r)
}

// readCloser exposes only Read and Close of the body it wraps.
type readCloser struct{ io.ReadCloser }
