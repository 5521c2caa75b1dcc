package outboxpglog

import "testing"

// TestSnapshotSawCommitted: a 32-bit xid from the log is read in the snapshot's epoch.
func TestSnapshotSawCommitted(t *testing.T) {
	sn, err := parseSnapshot("100:105:101,103")
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint32]bool{99: true, 100: true, 101: false, 102: true, 103: false, 104: true, 105: false, 200: false} {
		if got := sn.sawCommitted(xid); got != want {
			t.Errorf("xid %d: sawCommitted %v, want %v", xid, got, want)
		}
	}
	// Epoch 1: xmax is 2^32+5; xid 0xFFFFFFF0 is of epoch 0, committed; xid 3 of epoch 1.
	sn, err = parseSnapshot("4294967290:4294967301:4294967300")
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint32]bool{0xFFFFFFF0: true, 0xFFFFFFFB: true, 3: true, 4: false, 5: false} {
		if got := sn.sawCommitted(xid); got != want {
			t.Errorf("epoch 1, xid %d: sawCommitted %v, want %v", xid, got, want)
		}
	}
	if _, err := parseSnapshot("1:2"); err == nil {
		t.Error("a snapshot without xip parsed")
	}
}
