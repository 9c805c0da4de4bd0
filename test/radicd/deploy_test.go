package radicd_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/radic-project/radic/internal/radicd"
	"github.com/radic-project/radic/internal/testenv"
)

func deployFile(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(testenv.Root(t), "deploy", name)
}

// TestSystemdVerify checks the unit with the built radicd in place of
// /usr/local/bin/radicd (verify needs ExecStart to exist).
func TestSystemdVerify(t *testing.T) {
	sa := testenv.RequireCommand(t, "systemd-analyze")
	unit, err := os.ReadFile(deployFile(t, "radicd.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "Restart=on-failure", "StateDirectory=", "RuntimeDirectory=", "NoNewPrivileges=yes", "ProtectSystem=strict"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("radicd.service lacks %s", want)
		}
	}
	tmp := filepath.Join(t.TempDir(), "radicd.service")
	if err := os.WriteFile(tmp, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/radicd", radicdBin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", tmp).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func TestPromtoolChecks(t *testing.T) {
	pt := testenv.RequireCommand(t, "promtool")
	for _, args := range [][]string{
		{"check", "config", deployFile(t, "prometheus.yml")},
		{"check", "rules", deployFile(t, "radicd.rules.yml")},
		// The alerts' unit tests (the rule file is named relative to it).
		{"test", "rules", deployFile(t, "radicd.rules.test.yml")},
	} {
		cmd := exec.Command(pt, args...)
		cmd.Dir = filepath.Dir(deployFile(t, "radicd.rules.yml"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		} else {
			t.Logf("promtool %s %s: %s", args[0], args[1], strings.Join(strings.Fields(string(out)), " "))
		}
	}
}

// metricFamilies returns the names of radic_* families a radicd exports.
func metricFamilies(t *testing.T, addr string) []string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var names []string
	for _, l := range strings.Split(string(b), "\n") {
		if f, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name := strings.Fields(f)[0]
			if strings.HasPrefix(name, "radic_") {
				names = append(names, name)
			}
		}
	}
	return names
}

// TestMetricsAndDashboard checks that radicd exports every metric it
// documents and the issue requires, and every metric the Grafana dashboard
// and the alert rules use.
func TestMetricsAndDashboard(t *testing.T) {
	r := startRing(t, 51, 3, nil)
	have := metricFamilies(t, r.metrics(0))
	for _, want := range append([]string{"radic_heartbeats_sent_total", "radic_heartbeats_missed_total",
		"radic_failures_detected_total", "radic_detection_seconds", "radic_ring_size", "radic_store_bytes",
		"radic_store_records_total"}, radicd.MetricNames...) {
		if !slices.Contains(have, want) {
			t.Errorf("radicd does not export %s", want)
		}
	}
	re := regexp.MustCompile(`radic_[a-z_]+`)
	for _, file := range []string{"grafana-radicd.json", "radicd.rules.yml"} {
		b, err := os.ReadFile(deployFile(t, file))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(file, ".json") {
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
		}
		used := map[string]bool{}
		for _, m := range re.FindAllString(string(b), -1) {
			base := m
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if s, ok := strings.CutSuffix(m, suf); ok && slices.Contains(have, s) {
					base = s
				}
			}
			used[base] = true
		}
		if len(used) < 5 {
			t.Errorf("%s uses only %d radic metrics", file, len(used))
		}
		for m := range used {
			if !slices.Contains(have, m) {
				t.Errorf("%s uses %s, which radicd does not export", file, m)
			}
		}
		t.Logf("%s: %d radic metrics, all exported", file, len(used))
	}
}

// TestPrometheusScrapesRadicd runs the real Prometheus with deploy/'s
// configuration and rules against 3 radicd and queries its HTTP API for the
// required metrics of every instance.
func TestPrometheusScrapesRadicd(t *testing.T) {
	prom := testenv.RequireCommand(t, "prometheus")
	r := startRing(t, 56, 3, nil)
	dir := t.TempDir()
	cfg, err := os.ReadFile(deployFile(t, "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	fast := strings.NewReplacer("scrape_interval: 5s", "scrape_interval: 1s", "scrape_timeout: 4s", "scrape_timeout: 1s",
		"evaluation_interval: 5s", "evaluation_interval: 1s").Replace(string(cfg))
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(fast), 0o644))
	rules, err := os.ReadFile(deployFile(t, "radicd.rules.yml"))
	must(err)
	must(os.WriteFile(filepath.Join(dir, "radicd.rules.yml"), rules, 0o644))
	targets := fmt.Sprintf(`[{"targets": [%q, %q, %q], "labels": {"cluster": "test"}}]`, r.metrics(0), r.metrics(1), r.metrics(2))
	must(os.WriteFile(filepath.Join(dir, "radicd-targets.json"), []byte(targets), 0o644))

	web := "127.78.0.59:9090"
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+web)
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	must(err)
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	must(cmd.Start())
	pid := cmd.Process.Pid
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-waited
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	})

	// Kill and restart node 1 so that the failure metrics have data.
	r.kill(1)
	if _, ok := r.waitDeclared(2, 1, 3*time.Second); !ok {
		t.Fatal("node 1 not declared")
	}
	r.start(1)

	query := func(q string) (int, error) {
		resp, err := http.Get("http://" + web + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var res struct {
			Status string `json:"status"`
			Data   struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
			Error string `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			return 0, err
		}
		if res.Status != "success" {
			return 0, fmt.Errorf("%s", res.Error)
		}
		return len(res.Data.Result), nil
	}
	checks := []struct {
		q    string
		want int
	}{
		{`count by (instance) (radic_heartbeats_sent_total)`, 3},
		{`count by (instance) (radic_heartbeats_missed_total)`, 3},
		{`count by (instance) (radic_failures_detected_total{kind="unreachable"})`, 3},
		{`count by (instance) (radic_detection_seconds_bucket)`, 3},
		{`radic_detection_seconds_count > 0`, 1}, // node 2 declared node 1
		{`radic_ring_size == 3`, 3},
		{`count by (instance) (radic_store_bytes)`, 3},
		{`count by (instance) (radic_store_records_total)`, 3},
		{`up{job="radicd"} == 1`, 3},
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range checks {
		for {
			n, err := query(c.q)
			if err == nil && n >= c.want {
				t.Logf("prometheus: %s -> %d series", c.q, n)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("prometheus query %s: %d series (%v), want %d", c.q, n, err, c.want)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	// The rules loaded and evaluate.
	resp, err := http.Get("http://" + web + "/api/v1/rules")
	must(err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "RadicNodeDeclaredDead") || !strings.Contains(string(b), `"health":"ok"`) {
		t.Errorf("alert rules not loaded or unhealthy: %.500s", b)
	}
}

// TestHelpAndConfigFile: --help documents every setting; a config-file
// typo names the key and the line; flags win over the file.
func TestHelpAndConfigFile(t *testing.T) {
	out, _ := exec.Command(radicdBin, "--help").CombinedOutput()
	for _, f := range []string{"node", "listen", "peers", "spare", "state-dir", "metrics-addr", "job-cgroup", "config",
		"heartbeat-period", "heartbeat-timeout", "probe-timeout", "fence-timeout", "fence-kill", "probers", "protectors",
		"store-sync", "log-stable", "pprof", "store-max-bytes", "store-memory", "log-level", "log-format"} {
		if !strings.Contains(string(out), "-"+f+" ") && !strings.Contains(string(out), "-"+f+"\n") {
			t.Errorf("--help does not document --%s", f)
		}
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.conf")
	os.WriteFile(bad, []byte("# test\nnode = 1\nheartbeat-perod = 50ms\n"), 0o644)
	cmd := exec.Command(radicdBin, "--config", bad)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `bad.conf:3: unknown key "heartbeat-perod"`) || !strings.Contains(string(out), `did you mean "heartbeat-period"`) {
		t.Errorf("typo in config: err %v, output %q; want the key, line 3 and a suggestion", err, out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("typo in config: exit %v, want 2", err)
	}
	good := filepath.Join(dir, "good.conf")
	os.WriteFile(good, []byte(fmt.Sprintf("node = 0\nlisten = 127.78.0.60:7470\npeers = 0=127.78.0.60:7470,1=127.78.0.61:7470\nstate-dir = %s\nheartbeat-period = 1ms\n", dir)), 0o644)
	out, err = exec.Command(radicdBin, "--config", good, "--heartbeat-period", "50ms", "--heartbeat-timeout", "10ms").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "timeout 10ms must be at least twice the period 50ms") {
		t.Errorf("flags over file: %v %q; want the command line's period (50ms) to win over the file's (1ms)", err, out)
	}
}
