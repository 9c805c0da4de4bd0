package radicd

import "testing"

// TestDirectoryKeepsFinished: pushes cross, so a rank's launch push may
// arrive after its finish; a finished instance stays finished until a
// later epoch, which a restart brings.
func TestDirectoryKeepsFinished(t *testing.T) {
	dir := newDirectory()
	fin := RankLoc{Job: "j", Rank: 1, Group: 2, Node: 2, Finished: true}
	dir.put(fin)
	dir.put(RankLoc{Job: "j", Rank: 1, Group: 2, Node: 2})
	if got := dir.group(2); len(got) != 1 || !got[0].Finished {
		t.Fatalf("after a late launch push: %+v, want finished", got)
	}
	dir.put(RankLoc{Job: "j", Rank: 1, Group: 2, Node: 4, Epoch: 1})
	if got := dir.group(2); len(got) != 1 || got[0].Finished || got[0].Node != 4 {
		t.Fatalf("after a restart at epoch 1: %+v, want running on node 4", got)
	}
}

// TestFinishedGroup: a group is left alone by a restart only when every
// rank of the job in it has finished (ranks of a group restart together:
// their traffic is not logged).
func TestFinishedGroup(t *testing.T) {
	dir := newDirectory()
	if dir.finishedGroup(2, "j") {
		t.Fatal("an unknown group counts as finished")
	}
	dir.put(RankLoc{Job: "j", Rank: 1, Group: 2, Node: 2, Finished: true})
	dir.put(RankLoc{Job: "j", Rank: 5, Group: 2, Node: 2})
	dir.put(RankLoc{Job: "k", Rank: 0, Group: 2, Node: 2, Finished: true})
	dir.put(RankLoc{Job: "j", Rank: 0, Group: 1, Node: 1, Finished: true})
	if dir.finishedGroup(2, "j") {
		t.Error("group 2 of job j finished with rank 5 still running")
	}
	if !dir.finishedGroup(2, "k") || !dir.finishedGroup(1, "j") {
		t.Error("a group whose ranks all finished is not finished")
	}
	dir.put(RankLoc{Job: "j", Rank: 5, Group: 2, Node: 2, Finished: true})
	if !dir.finishedGroup(2, "j") {
		t.Error("group 2 of job j not finished once rank 5 is")
	}
}
