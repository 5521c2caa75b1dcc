package cloudevents

import "testing"

// BenchmarkFromBinary decodes one of our messages (8 headers) as a receiver does.
func BenchmarkFromBinary(b *testing.B) {
	m := sample()
	h, err := ToBinary(m, "")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromBinary(h, m.Body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkToBinary encodes one of our messages as a sender does.
func BenchmarkToBinary(b *testing.B) {
	m := sample()
	b.ReportAllocs()
	for b.Loop() {
		if err := EachBinary(m, "", func(string, string) {}); err != nil {
			b.Fatal(err)
		}
	}
}
