package scale

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// auditPolicy logs the metadata of every write, once, when it completes.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
`

// auditEvent is the part of an audit.k8s.io/v1 Event the count needs.
type auditEvent struct {
	Stage     string    `json:"stage"`
	Verb      string    `json:"verb"`
	UserAgent string    `json:"userAgent"`
	Received  time.Time `json:"requestReceivedTimestamp"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
}

// CountAuditWrites counts the writes received in [from, to] by client and
// "verb resource[/subresource]".
func CountAuditWrites(path string, from, to time.Time) (map[string]map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	defer f.Close()
	out := map[string]map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("audit log %s line %d: %w", path, line, err)
		}
		if ev.Stage != "ResponseComplete" || ev.Received.Before(from) || ev.Received.After(to) {
			continue
		}
		what := ev.Verb
		if ev.ObjectRef != nil {
			what += " " + ev.ObjectRef.Resource
			if ev.ObjectRef.Subresource != "" {
				what += "/" + ev.ObjectRef.Subresource
			}
		}
		who := Client(ev.UserAgent, ev.User.Username)
		if out[who] == nil {
			out[who] = map[string]int{}
		}
		out[who][what]++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read audit log %s: %w", path, err)
	}
	return out, nil
}

// Client names who made a request: the program of its user agent, and for
// kube-controller-manager the controller, from its service account.
func Client(userAgent, username string) string {
	prog, _, _ := strings.Cut(userAgent, "/")
	if prog == "" {
		prog = "unknown"
	}
	if sa, ok := strings.CutPrefix(username, "system:serviceaccount:kube-system:"); ok && prog == "kube-controller-manager" {
		return prog + " " + sa
	}
	return prog
}
