package radicd

import "testing"

func TestStripLogTime(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"2026-12-07T03:22:41.243Z radic[25923]: replay done: live\n", "radic[25923]: replay done: live\n"},
		{"radic[7]: no time\n", "radic[7]: no time\n"},
		{"2026-12-07 03:22:41 radic[7]: another format is left alone\n", "2026-12-07 03:22:41 radic[7]: another format is left alone\n"},
	} {
		if got := string(stripLogTime([]byte(c.in))); got != c.want {
			t.Errorf("stripLogTime(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
