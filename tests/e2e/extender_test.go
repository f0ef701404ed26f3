package e2e

// The extender under test: the project's release binary as a child process, started with the
// chart's args (listen addresses moved to free loopback ports) and the chart ServiceAccount's
// kubeconfig. Killed with SIGKILL when a scenario wants a crash.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

type extenderProc struct {
	*childProc
	cp     *controlPlane
	listen string
	probe  string
}

// extenderBinary is the release binary (scripts/e2e.sh builds it), or DNE_E2E_BINARY.
func extenderBinary() (string, error) {
	bin := os.Getenv("DNE_E2E_BINARY")
	if bin == "" {
		bin = filepath.Join(repoRoot(), "target", "release", "device-numa-extender")
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("extender binary %s: %w (build it with `cargo build --release --locked`, or run scripts/e2e.sh)", bin, err)
	}
	return bin, nil
}

func freeLoopbackAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startExtender starts the binary on fresh ports; the scheduler must be (re)pointed at
// urlPrefix() by the caller when the port matters. listen "" picks a free port.
func (cp *controlPlane) startExtender(listen string, extraArgs ...string) *extenderProc {
	// kube-scheduler's Lease holder identity is `<hostname>_<uuid>`, and here the scheduler runs
	// on this host: the sidecar's pod name is the host name.
	hostname, _ := os.Hostname()
	return cp.startExtenderAs(hostname, listen, extraArgs...)
}

// startExtenderAs starts a replica whose POD_NAME (its Lease identity) is podName.
func (cp *controlPlane) startExtenderAs(podName, listen string, extraArgs ...string) *extenderProc {
	t := cp.t
	bin, err := extenderBinary()
	if err != nil {
		t.Fatal(err)
	}
	if listen == "" {
		listen = freeLoopbackAddr()
	}
	e := &extenderProc{cp: cp, listen: listen, probe: freeLoopbackAddr()}
	args := append(cp.chart.extenderArgsFor(e.listen, e.probe), extraArgs...)
	cmd := exec.Command(bin, args...)
	// POD_NAME / POD_NAMESPACE come from the downward API in the chart.
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+cp.extenderKubeconfig,
		"POD_NAME="+podName,
		"POD_NAMESPACE="+cp.chart.Namespace,
	)
	logPath := filepath.Join(cp.dir, fmt.Sprintf("extender-%d.log", time.Now().UnixNano()))
	e.childProc = startChild(t, "extender", cmd, logPath, 60)
	cp.extender = e
	return e
}

func (e *extenderProc) urlPrefix() string { return "http://" + e.listen }

// readyz is the status code of GET /readyz?standby=ok (the chart's readiness probe in
// scheduler mode), 0 when the process does not answer.
func (e *extenderProc) readyz() int { return e.probeStatus("/readyz?standby=ok") }

// readyzPlain is GET /readyz (standalone mode's readiness probe: a standby is not ready).
func (e *extenderProc) readyzPlain() int { return e.probeStatus("/readyz") }

func (e *extenderProc) probeStatus(path string) int {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + e.probe + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func (e *extenderProc) waitReady() {
	err := wait.PollUntilContextTimeout(e.cp.ctx, 100*time.Millisecond, hangGuard, true, func(context.Context) (bool, error) {
		select {
		case <-e.exited:
			return false, fmt.Errorf("extender exited")
		default:
		}
		return e.readyz() == http.StatusOK, nil
	})
	if err != nil {
		e.cp.t.Fatalf("extender never ready: %v\n%s", err, tail(e.logPath, 40))
	}
}

// metrics is the text of /metrics on the probe port.
func (e *extenderProc) metrics() string {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + e.probe + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricLines are the sample lines of a metrics text whose name contains `name`.
func metricLines(text, name string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "#") && strings.Contains(line, name) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "; ")
}
