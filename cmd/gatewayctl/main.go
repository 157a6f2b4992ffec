// Command gatewayctl administers the gateway's cloud side: it creates the DynamoDB tables,
// probes the endpoint's transaction size limit and manages device API keys. It also shows
// a running gatewayd's status and inspects, exports and re-forwards what a gatewayd's
// buffer holds.
//
//	gatewayctl tables create [flags]
//	gatewayctl tables probe [flags]
//	gatewayctl keys create [flags] [--description TEXT] [--hardware-id HW]
//	gatewayctl keys revoke [flags] KEY_ID
//	gatewayctl keys list [flags] [--json]
//	gatewayctl devices reset-key [--url URL] [--admin-token-file FILE] HW
//	gatewayctl readings latest [flags]
//	gatewayctl readings range --hardware-id HW [--from T] [--to T] [--limit N] [--cursor C] [--all] [--json]
//	gatewayctl readings summary --hardware-id HW --granularity hour|day|month [--from T] [--to T] [--tz ZONE] [--include-empty B] [--json]
//	gatewayctl status [--url URL] [--admin-token-file FILE] [--json]
//	gatewayctl buffer inspect|export|dead-letters|reforward [flags]
//	gatewayctl --version
//
// Every command takes --dynamodb-endpoint, --aws-region and --table-prefix (environment
// GATEWAY_DYNAMODB_ENDPOINT, GATEWAY_AWS_REGION, GATEWAY_TABLE_PREFIX); AWS credentials come
// from the SDK's default chain. keys create needs the pepper, from --api-key-pepper-file
// (GATEWAY_API_KEY_PEPPER_FILE) or GATEWAY_API_KEY_PEPPER. Exit status: 0 success, 1 error,
// 2 wrong usage.
//
// A key created with --hardware-id is a device key: it authenticates that one device only.
// Other keys are fleet keys, which any device may use (and which enroll a device: its first
// registration answers its own device key). devices reset-key asks a running gatewayd to
// revoke a device's key so that the device can enroll again.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/internal/cloud"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// Environment variables read by gatewayctl; flags override them.
const (
	envEndpoint   = "GATEWAY_DYNAMODB_ENDPOINT"
	envRegion     = "GATEWAY_AWS_REGION"
	envPrefix     = "GATEWAY_TABLE_PREFIX"
	envPepper     = "GATEWAY_API_KEY_PEPPER"
	envPepperFile = "GATEWAY_API_KEY_PEPPER_FILE"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

const mainUsage = `usage: gatewayctl <command> [flags] [arguments]

commands:
  tables create   create the four DynamoDB tables (idempotent), wait until active, enable TTL
  tables probe    print how many actions one TransactWriteItems accepts here (100, 25 or 10)
  keys create     create an API key (a fleet key, or with --hardware-id HW a device key
                  bound to that device); prints only the raw key on stdout
  keys revoke     revoke an API key: gatewayctl keys revoke [flags] KEY_ID
  keys list       list API keys, newest first, with their binding (hardware_id or fleet)
  devices reset-key  let a device that lost its device key enroll again (asks a running
                  gatewayd): gatewayctl devices reset-key [--url URL] HW
  readings latest print the newest readings in device_readings
  readings range  print a device's readings in a time range from device_readings, paginated
  readings summary  summarise a device's readings from device_readings in hour, day or month
                  buckets of a time zone (the operator APIs' summary)
  status          ask a running gatewayd for its readiness, uplink, devices and dead letters
  buffer inspect  check a stopped gatewayd's buffer and print what it holds
  buffer export   write a stopped gatewayd's pending and dead-lettered batches as NDJSON
  buffer dead-letters  list dead-lettered batches (--data-dir DIR or --url URL)
  buffer reforward     queue a dead-lettered batch again (--data-dir DIR or --url URL)

Flags follow the command; "gatewayctl <command> -h" lists them.
"gatewayctl --version" prints the version.
`

// command is one subcommand: its flags are registered on fs, run does the work.
type command struct {
	name  string // e.g. "keys revoke"
	args  string // positional arguments for the usage line
	about string
	// npos is the exact number of positional arguments.
	npos int
	// local commands do not reach DynamoDB: no cloud flags.
	local bool
	setup func(fs *flag.FlagSet, getenv func(string) string) func(ctx context.Context, env *cmdEnv, pos []string) error
}

// cmdEnv is what a running command needs besides its flags.
type cmdEnv struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	cloud          *cloudFlags
}

var commands = []command{
	{name: "tables create", about: "Create the devices, device_readings, processed_batches and api_keys tables if\n" +
		"missing, wait until they are ACTIVE and enable TTL on expiration_time.", setup: setupTablesCreate},
	{name: "tables probe", about: "Print how many actions one TransactWriteItems accepts on the endpoint (100 on AWS,\n" +
		"10 on DynamoDB Local 1.11.478). Writes nothing; needs the processed_batches table.", setup: setupTablesProbe},
	{name: "keys create", args: "[--description TEXT] [--hardware-id HW]", about: "Create an active API key. The raw key is printed on stdout, alone, and only once;\n" +
		"the key id and its binding go to stderr. Without --hardware-id it is a fleet key, which any\n" +
		"device may use; with it, a device key that authenticates only the device HW.", setup: setupKeysCreate},
	{name: "keys revoke", args: "KEY_ID", npos: 1, about: "Mark the API key KEY_ID inactive.", setup: setupKeysRevoke},
	{name: "keys list", args: "[--json]", about: "List API keys, newest first: key_id, active, binding (the hardware_id of a device\n" +
		"key, or fleet), created_at, last_used_at, description.", setup: setupKeysList},
	{name: "devices reset-key", local: true, args: "[--url URL] [--admin-token-file FILE] HW", npos: 1,
		about: "Ask a running gatewayd (POST /v1/devices/HW/reset-key) to revoke the device key of HW, at\n" +
			"once on the gateway and in api_keys through its uplink, so that the device's next\n" +
			"registration with a fleet key enrolls it again (a device that lost its key). The admin\n" +
			"token comes from --admin-token-file or GATEWAY_ADMIN_TOKEN.", setup: setupDevicesResetKey},
	{name: "readings latest", args: "[--hardware-id HW] [--limit N]", about: "Print the newest readings in device_readings, read straight from DynamoDB.",
		setup: setupReadingsLatest},
	{name: "readings range", args: "--hardware-id HW [--from T] [--to T] [--limit N] [--cursor C] [--all] [--json]",
		about: "Print a device's readings in [--from, --to) from device_readings (a Query with BETWEEN on ts_batch),\n" +
			"one sensor value a row, oldest first: the rows, cursor and JSON (--json) of the operator APIs'\n" +
			"GET /v1/devices/HW/readings, computed by the same code.", setup: setupReadingsRange},
	{name: "readings summary", args: "--hardware-id HW --granularity hour|day|month [--from T] [--to T] [--tz ZONE] [--include-empty B] [--json]",
		about: "Summarise a device's readings in [--from, --to) from device_readings, in calendar buckets of --tz:\n" +
			"the operator APIs' GET /v1/devices/HW/summary (its JSON with --json), computed by the same code.",
		setup: setupReadingsSummary},
	{name: "status", local: true, args: "[--url URL] [--admin-token-file FILE] [--json]", about: "Ask a running gatewayd (GET /readyz, /v1/uplink, /v1/devices, /v1/dead-letters)\n" +
		"and print a summary. The admin token comes from --admin-token-file or GATEWAY_ADMIN_TOKEN.", setup: setupStatus},
	{name: "buffer inspect", local: true, args: "--data-dir DIR [--top N] [--json]", about: "Check a stopped gatewayd's buffer as gatewayd does at start and print what it holds:\n" +
		"pending batches by device, delivered markers, dead letters with their reasons, state records, space.",
		setup: setupBufferInspect},
	{name: "buffer export", local: true, args: "--data-dir DIR [--what pending|dead|all] [--hardware-id HW] [--out FILE]",
		about: "Write a stopped gatewayd's batches as NDJSON, one batch a line with its payload as JSON.", setup: setupBufferExport},
	{name: "buffer salvage", local: true, args: "--data-dir DIR --out NEWDIR [--json]",
		about: "Read every readable table block and write-ahead log entry of a damaged buffer (DIR is only read)\n" +
			"and write its pending batches, dead letters and state records into a new buffer at NEWDIR,\n" +
			"for gatewayd to start on; report what was recovered and what was skipped.", setup: setupBufferSalvage},
	{name: "buffer dead-letters", local: true, args: "(--data-dir DIR | --url URL) [--limit N] [--json]",
		about: "List dead-lettered batches with the cloud's reason.", setup: setupBufferDeadLetters},
	{name: "buffer reforward", local: true, args: "(--data-dir DIR | --url URL) BATCH_ID", npos: 1,
		about: "Move a dead-lettered batch back to the end of the queue, to be forwarded again.\n" +
			"It then reaches the cloud after batches its device sent later.", setup: setupBufferReforward},
}

// usageError is wrong usage: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, mainUsage)
		return exitOK
	case "-version", "--version", "version":
		fmt.Fprintf(stdout, "gatewayctl %s\n", version)
		return exitOK
	}
	if len(args) >= 2 && (args[1] == "-h" || args[1] == "-help" || args[1] == "--help") && args[0] != "status" {
		fmt.Fprint(stdout, mainUsage)
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr, getenv)
		}
	}
	if len(args) < 2 || strings.HasPrefix(args[1], "-") {
		fmt.Fprintf(stderr, "gatewayctl: %q needs a subcommand\n\n%s", args[0], mainUsage)
		return exitUsage
	}
	name := args[0] + " " + args[1]
	for _, c := range commands {
		if c.name == name {
			return c.run(ctx, args[2:], stdout, stderr, getenv)
		}
	}
	fmt.Fprintf(stderr, "gatewayctl: unknown command %q\n\n%s", name, mainUsage)
	return exitUsage
}

func (c command) run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("gatewayctl "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: gatewayctl %s [flags]", c.name)
		if c.args != "" {
			fmt.Fprintf(out, " %s", c.args)
		}
		fmt.Fprintf(out, "\n\n%s\n\nflags:\n", c.about)
		fs.PrintDefaults()
	}
	env := &cmdEnv{stdout: stdout, stderr: stderr, getenv: getenv}
	if c.local {
		env.cloud = &cloudFlags{timeout: 30 * time.Minute}
		fs.DurationVar(&env.cloud.timeout, "timeout", env.cloud.timeout, "give up after this long")
	} else {
		env.cloud = registerCloudFlags(fs, getenv)
	}
	do := c.setup(fs, getenv)

	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage // flag already printed the error and the usage
	}
	if len(pos) != c.npos {
		if c.npos == 0 {
			fmt.Fprintf(stderr, "gatewayctl %s: unexpected arguments %q\n", c.name, pos)
		} else {
			fmt.Fprintf(stderr, "gatewayctl %s: want %s, got %d arguments\n", c.name, c.args, len(pos))
		}
		fs.Usage()
		return exitUsage
	}

	ctx, cancel := context.WithTimeout(ctx, env.cloud.timeout)
	defer cancel()
	err = do(ctx, env, pos)
	var uerr usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "gatewayctl %s: %v\n", c.name, err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "gatewayctl %s: %v\n", c.name, err)
		return exitError
	}
}

// parseInterleaved parses flags that may come before, between or after positional
// arguments ("keys revoke KEY_ID --dynamodb-endpoint URL"); after "--" all is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return pos, nil
}

// cloudFlags are the flags every command takes.
type cloudFlags struct {
	cfg     cloud.Config
	timeout time.Duration
}

func registerCloudFlags(fs *flag.FlagSet, getenv func(string) string) *cloudFlags {
	f := &cloudFlags{timeout: 2 * time.Minute}
	fs.StringVar(&f.cfg.Endpoint, "dynamodb-endpoint", getenv(envEndpoint),
		"DynamoDB endpoint URL, e.g. http://127.0.0.1:8000 for DynamoDB Local; empty means AWS (env "+envEndpoint+")")
	fs.StringVar(&f.cfg.Region, "aws-region", getenv(envRegion),
		"AWS region; empty means the AWS SDK chain (AWS_REGION, ~/.aws/config) (env "+envRegion+")")
	fs.StringVar(&f.cfg.TablePrefix, "table-prefix", getenv(envPrefix),
		"prefix prepended verbatim to every table name (env "+envPrefix+")")
	fs.DurationVar(&f.timeout, "timeout", f.timeout, "give up after this long")
	return f
}

// client validates the cloud flags and returns a client and the table names.
func (e *cmdEnv) client(ctx context.Context) (*dynamodb.Client, cloud.Tables, error) {
	if err := e.cloud.cfg.Validate(); err != nil {
		var fe *cloud.FieldError
		if errors.As(err, &fe) {
			// The value came from the flag or its environment variable.
			fe.Field = map[string]string{
				"endpoint":     "--dynamodb-endpoint (" + envEndpoint + ")",
				"region":       "--aws-region (" + envRegion + ")",
				"table_prefix": "--table-prefix (" + envPrefix + ")",
			}[fe.Field]
		}
		return nil, cloud.Tables{}, usageError{msg: err.Error()}
	}
	if e.cloud.timeout <= 0 {
		return nil, cloud.Tables{}, usageError{msg: "--timeout must be positive"}
	}
	client, err := cloud.NewClient(ctx, e.cloud.cfg)
	if err != nil {
		return nil, cloud.Tables{}, err
	}
	return client, cloud.TableNames(e.cloud.cfg.TablePrefix), nil
}

func setupTablesCreate(*flag.FlagSet, func(string) string) func(context.Context, *cmdEnv, []string) error {
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		client, tables, err := env.client(ctx)
		if err != nil {
			return err
		}
		logger := slog.New(slog.NewTextHandler(env.stderr, nil)).With("component", "gatewayctl")
		return cloud.CreateTables(ctx, client, tables, logger)
	}
}

func setupTablesProbe(*flag.FlagSet, func(string) string) func(context.Context, *cmdEnv, []string) error {
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		client, tables, err := env.client(ctx)
		if err != nil {
			return err
		}
		n, err := cloud.ProbeTransactionLimit(ctx, client, tables.ProcessedBatches)
		if err != nil {
			return err
		}
		fmt.Fprintln(env.stdout, n)
		return nil
	}
}

// registerPepperFlag registers --api-key-pepper-file on every keys command, so scripts can
// pass it uniformly; only keys create needs the pepper.
func registerPepperFlag(fs *flag.FlagSet, getenv func(string) string) *string {
	return fs.String("api-key-pepper-file", getenv(envPepperFile),
		"file holding the API key pepper (env "+envPepperFile+"; or the pepper itself in "+envPepper+")")
}

func setupKeysCreate(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	pepperFile := registerPepperFlag(fs, getenv)
	description := fs.String("description", "", "operator's note stored with the key, e.g. \"greenhouse 3 sensors\"")
	hardwareID := fs.String("hardware-id", "", "bind the key to this device (e.g. AA:BB:CC:DD:EE:FF): it authenticates that hardware_id only; "+
		"without it, a fleet key any device may use")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		if *hardwareID != "" {
			if err := contract.ValidHardwareID(*hardwareID); err != nil {
				return usageError{msg: "--hardware-id: " + contract.AsError(err).Rule}
			}
		}
		envPepperValue := env.getenv(envPepper)
		if *pepperFile == "" && envPepperValue == "" {
			_, err := cloud.LoadPepper("", "")
			return usageError{msg: err.Error()}
		}
		pepper, err := cloud.LoadPepper(envPepperValue, *pepperFile)
		if err != nil {
			return err
		}
		client, tables, err := env.client(ctx)
		if err != nil {
			return err
		}
		raw, info, err := cloud.NewKeys(client, tables.APIKeys, pepper).CreateBound(ctx, *description, *hardwareID)
		if err != nil {
			return err
		}
		fmt.Fprintln(env.stdout, raw)
		binding := "a fleet key: any device may use it"
		if info.HardwareID != "" {
			binding = "a device key bound to hardware_id " + info.HardwareID + ": it authenticates that device only"
		}
		fmt.Fprintf(env.stderr, "created api key %s in %s (created_at %s), %s; the raw key on stdout is not stored and cannot be shown again\n",
			info.KeyID, tables.APIKeys, cloud.FormatTime(info.CreatedAt), binding)
		return nil
	}
}

func setupKeysRevoke(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	registerPepperFlag(fs, getenv)
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		client, tables, err := env.client(ctx)
		if err != nil {
			return err
		}
		if err := cloud.NewKeys(client, tables.APIKeys, "").Revoke(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(env.stderr, "revoked api key %s\n", pos[0])
		return nil
	}
}

// keyView is one key as keys list --json prints it: never its hash.
type keyView struct {
	KeyID  string `json:"key_id"`
	Active bool   `json:"active"`
	// Binding is the hardware_id of a device key, or "fleet".
	Binding string `json:"binding"`
	// HardwareID is the hardware_id of a device key; null for a fleet key.
	HardwareID  *string `json:"hardware_id"`
	CreatedAt   string  `json:"created_at"`
	LastUsedAt  *string `json:"last_used_at"`
	Description string  `json:"description"`
}

// bindingFleet is the binding keys list shows for a key bound to no device.
const bindingFleet = "fleet"

func newKeyView(k cloud.KeyInfo) keyView {
	v := keyView{KeyID: k.KeyID, Active: k.Active, Binding: bindingFleet, CreatedAt: cloud.FormatTime(k.CreatedAt),
		Description: k.Description}
	if k.HardwareID != "" {
		v.Binding, v.HardwareID = k.HardwareID, &k.HardwareID
	}
	if !k.LastUsedAt.IsZero() {
		lastUsed := cloud.FormatTime(k.LastUsedAt)
		v.LastUsedAt = &lastUsed
	}
	return v
}

func setupKeysList(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	registerPepperFlag(fs, getenv)
	asJSON := fs.Bool("json", false, "print the keys as a JSON array")
	return func(ctx context.Context, env *cmdEnv, _ []string) error {
		client, tables, err := env.client(ctx)
		if err != nil {
			return err
		}
		keys, err := cloud.NewKeys(client, tables.APIKeys, "").List(ctx)
		if err != nil {
			return err
		}
		views := make([]keyView, len(keys))
		for i, k := range keys {
			views[i] = newKeyView(k)
		}
		if *asJSON {
			return printIndentedJSON(env.stdout, views)
		}
		tw := tabwriter.NewWriter(env.stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY_ID\tACTIVE\tBINDING\tCREATED_AT\tLAST_USED_AT\tDESCRIPTION")
		for _, v := range views {
			lastUsed := "-"
			if v.LastUsedAt != nil {
				lastUsed = *v.LastUsedAt
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.KeyID, strconv.FormatBool(v.Active), v.Binding,
				v.CreatedAt, lastUsed, oneLine(v.Description))
		}
		return tw.Flush()
	}
}

// oneLine keeps a description on its table row.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
