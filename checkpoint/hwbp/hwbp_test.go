package hwbp

import "testing"

// TestProbeAnswers: the probe gives an answer here (the cross-check
// against CRIU itself is in checkpoint/criu: TestProbeAgreesWithCRIU), and
// the same answer twice.
func TestProbeAnswers(t *testing.T) {
	r1, err := Probe()
	if err != nil {
		t.Fatalf("Probe() = %v", err)
	}
	t.Logf("%v in %v", r1, r1.Took)
	r2, err := Probe()
	if err != nil {
		t.Fatalf("second Probe() = %v", err)
	}
	if r1.Trap != r2.Trap {
		t.Errorf("Probe() said trap=%v, then trap=%v", r1.Trap, r2.Trap)
	}
}
