package sqlstore

import (
	"slices"
	"testing"
)

func TestPlanWindowTakesRunsInWaves(t *testing.T) {
	t.Parallel()
	row := func(seq int64, key string, free bool) claimRow { return claimRow{seq: seq, key: key, free: free} }
	window := []claimRow{
		row(1, "a", true), row(2, "b", false), row(3, "", true), row(4, "a", true),
		row(5, "b", true),                                        // b's first row is in flight: b gives nothing
		row(6, "c", true), row(7, "a", false), row(8, "a", true), // a's run ends at 7
		row(9, "", false), row(10, "c", true), row(11, "d", true), row(12, "e", true),
	}
	var got []int64
	for _, c := range planWindow(window, 100) {
		got = append(got, c.seq)
	}
	// Keys a, c, d, e have runs; the older half (a, c) goes first, oldest rows first, with
	// the keyless row; then d and e.
	want := []int64{1, 3, 4, 6, 10, 11, 12}
	if !slices.Equal(got, want) {
		t.Fatalf("planned %v, want %v", got, want)
	}
	if got := planWindow(window, 3); len(got) != 3 || got[2].seq != 4 {
		t.Fatalf("a plan of 3 is %v, want the first three of %v", got, want)
	}
}

func TestKeepRunsCutsARunAtItsFirstMissingRow(t *testing.T) {
	t.Parallel()
	cand := func(seq int64, key string) claimCandidate {
		return claimCandidate{claimRow: claimRow{seq: seq, key: key, free: true}}
	}
	plan := []claimCandidate{cand(1, "a"), cand(2, ""), cand(3, "a"), cand(4, "b"), cand(5, "a"), cand(6, ""), cand(7, "b")}
	// Row 3 (a) was taken by another claim since the plan, and keyless row 6 too.
	keep, giveBack := keepRuns(plan, map[int64]bool{1: true, 2: true, 4: true, 5: true, 7: true})
	if want := []int64{1, 2, 4, 7}; !slices.Equal(keep, want) {
		t.Errorf("kept %v, want %v", keep, want)
	}
	if want := []int64{5}; !slices.Equal(giveBack, want) {
		t.Errorf("gave back %v, want %v (a's row after the missing one)", giveBack, want)
	}
}
