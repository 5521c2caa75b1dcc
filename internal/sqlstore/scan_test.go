package sqlstore

import "testing"

// fakeRows yields n rows whose columns stay zero (each one an unreadable message, which is
// still a claimed row).
type fakeRows struct{ n int }

func (r *fakeRows) Next() bool {
	r.n--
	return r.n >= 0
}
func (r *fakeRows) Scan(...any) error { return nil }
func (r *fakeRows) Err() error        { return nil }
func (r *fakeRows) Close()            {}

// An idle relay's claims are mostly empty: their result must cost nothing, and a claim of a
// few rows must not be sized for the whole limit (a 500-row result is 100 KB).
func TestScanClaimedSizesItsResult(t *testing.T) {
	for _, tc := range []struct {
		name            string
		rows, limit     int
		backlog         bool
		wantLen, atMost int
	}{
		{"empty claim", 0, 500, false, 0, 0},
		{"empty claim of a loop in a backlog", 0, 500, true, 0, 0},
		{"one row", 1, 500, false, 1, scanFirstCap},
		{"a backlog's full claim, sized at once", 500, 500, true, 500, 500},
		{"more rows than expected: it grows", 40, 500, false, 40, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := scanClaimed(&fakeRows{n: tc.rows}, tc.limit, tc.backlog, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tc.wantLen || cap(got) > tc.atMost {
				t.Errorf("len %d cap %d, want len %d cap at most %d", len(got), cap(got), tc.wantLen, tc.atMost)
			}
		})
	}
}
