package cluster

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePeers(t *testing.T) {
	got, err := ParsePeers(" jobset,kueue ,")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Peer{PeerJobSet, PeerKueue}, got); diff != "" {
		t.Errorf("peers (-want +got):\n%s", diff)
	}
	if _, err := ParsePeers("jobset,volcano"); err == nil {
		t.Error("an unknown peer was accepted")
	}
}

func TestConfigRefusesMissingPeers(t *testing.T) {
	dir := t.TempDir()
	err := checkPeers(dir, []Peer{PeerLWS})
	if err == nil {
		t.Fatal("a peer that was not built was accepted")
	}
	if err := checkPeers(dir, []Peer{"volcano"}); err == nil {
		t.Fatal("an unknown peer was accepted")
	}
}
