package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/radic-project/radic/internal/cluster"
	"github.com/radic-project/radic/internal/radicd"
)

func init() {
	register("checkpoint", "take one checkpoint of a job now: each node's ranks of it, together (criu where usable, else exec)", checkpointCmd)
}

// checkpointCmd asks every node's radicd of the cluster to checkpoint its
// ranks of the job (POST /v1/jobs/JOB/checkpoint) and prints what each
// did. Nodes are asked one after the other: each node's image is its own
// consistent cut (semi-coordinated, DESIGN.md contract 7); no cut across
// nodes is needed.
func checkpointCmd(args []string) error {
	fs := flag.NewFlagSet("radic checkpoint", flag.ContinueOnError)
	stateDir := fs.String("state-dir", cluster.DefaultStateDir(), "the cluster's state `DIR`")
	timeout := fs.Duration("timeout", 2*time.Minute, "per-node request timeout")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: radic checkpoint [flags] JOB")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("one JOB is required")
	}
	job := fs.Arg(0)
	s, err := cluster.Load(*stateDir)
	if err != nil {
		return fmt.Errorf("no cluster: %w", err)
	}
	if !s.Daemons {
		return errors.New("the cluster runs without daemons: nothing owns its ranks to checkpoint them")
	}
	hc := &http.Client{Timeout: *timeout}
	var replies []radicd.CheckpointReply
	var errs []error
	for _, n := range s.Nodes {
		addr := cluster.NodeDaemon(s, &n)
		if addr == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/jobs/"+url.PathEscape(job)+"/checkpoint", nil)
		resp, err := hc.Do(req)
		if err != nil {
			cancel()
			errs = append(errs, fmt.Errorf("node %d: %w", n.ID, err))
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		cancel()
		switch resp.StatusCode {
		case http.StatusOK:
			var r radicd.CheckpointReply
			if err := json.Unmarshal(body, &r); err != nil {
				errs = append(errs, fmt.Errorf("node %d: reply: %w", n.ID, err))
				continue
			}
			replies = append(replies, r)
		case http.StatusNotFound: // no rank of the job there
		default:
			errs = append(errs, fmt.Errorf("node %d: %s", n.ID, strings.TrimSpace(string(body))))
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(replies)
	} else {
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tBACKEND\tRANKS\tDUMP\tPACK\tRAW\tSTORED\tCHUNKS NEW/ALL\tIMAGE")
		for _, r := range replies {
			fmt.Fprintf(tw, "%d\t%s\t%v\t%.0fms\t%.0fms\t%s\t%s\t%d/%d\t%s\n", r.Node, r.Backend, r.Ranks,
				r.DumpMs, r.PackMs, human(r.Bytes), human(r.PackBytes), r.NewChunks, r.Chunks, r.Dir)
		}
		tw.Flush()
		for _, r := range replies {
			if r.NotCriu != "" {
				fmt.Fprintf(os.Stderr, "radic checkpoint: node %d: %s\n", r.Node, r.NotCriu)
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if len(replies) == 0 {
		return fmt.Errorf("no node runs a rank of job %q", job)
	}
	return nil
}

// human is n bytes, short.
func human(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
