//go:build linux

package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"greenhouse-gateway/internal/cloud"

	"greenhouse-gateway/harness/proc"
)

// Child process settings.
const (
	dynamoStartTimeout    = 90 * time.Second
	mosquittoStartTimeout = 10 * time.Second
	stopTimeout           = 20 * time.Second
	// mosquittoPath is where Debian's mosquitto package installs the broker.
	mosquittoPath = "/usr/sbin/mosquitto"
)

// dynamoJVMOptions give DynamoDB Local room for the drain's tables (they
// are deleted after each run) and full JIT compilation: throughput matters
// here, start-up time does not.
var dynamoJVMOptions = []string{"-Xms512m", "-Xmx2g", "-XX:+UseSerialGC", "-XX:-UsePerfData"}

// dynamoLocal is one DynamoDB Local JVM, in memory, on a free port.
type dynamoLocal struct {
	endpoint string
	logPath  string
	proc     *proc.Process
	client   *dynamodb.Client // SDK defaults (3 attempts), as gatewayctl uses
}

// startDynamoLocal starts DynamoDB Local from $DYNAMODB_LOCAL_DIR or
// <module root>/.cache/dynamodb-local ("make dynamodb-local" installs it).
func startDynamoLocal(ctx context.Context, root, workDir string) (*dynamoLocal, error) {
	dir := os.Getenv("DYNAMODB_LOCAL_DIR")
	if dir == "" {
		dir = filepath.Join(root, ".cache", "dynamodb-local")
	}
	jar := filepath.Join(dir, "DynamoDBLocal.jar")
	if _, err := os.Stat(jar); err != nil {
		return nil, fmt.Errorf("dynamodb local not installed (%v): run make dynamodb-local", err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("looking up java: %w (make dynamodb-local installs it)", err)
	}
	port, err := proc.FreePort()
	if err != nil {
		return nil, err
	}
	d := &dynamoLocal{endpoint: "http://127.0.0.1:" + strconv.Itoa(port), logPath: filepath.Join(workDir, "dynamodb-local.log")}
	logFile, err := os.Create(d.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	args := append(append([]string{}, dynamoJVMOptions...),
		"-Djava.library.path="+filepath.Join(dir, "DynamoDBLocal_lib"),
		"-jar", jar, "-sharedDb", "-inMemory", "-port", strconv.Itoa(port))
	cmd := exec.Command(java, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if d.proc, err = proc.Start("dynamodb-local", cmd); err != nil {
		return nil, err
	}
	// Connections enough for the plain writer's 32 goroutines and the SDK
	// loop's concurrency: each request reuses a connection, as gatewayd's
	// do (cloud.WithConnections).
	if d.client, err = cloud.NewClient(ctx, cloud.Config{Endpoint: d.endpoint, Region: awsRegion},
		cloud.WithConnections(256)); err != nil {
		d.proc.Kill()
		return nil, err
	}
	deadline := time.Now().Add(dynamoStartTimeout)
	for {
		if d.proc.Exited() {
			return nil, fmt.Errorf("dynamodb local exited during startup: %v\n%s", d.proc.Err(), tailFile(d.logPath, 2048))
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := d.client.ListTables(cctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
		cancel()
		if err == nil {
			return d, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			d.proc.Kill()
			return nil, fmt.Errorf("dynamodb local did not answer on %s within %s: %v\n%s",
				d.endpoint, dynamoStartTimeout, err, tailFile(d.logPath, 2048))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (d *dynamoLocal) stop() { d.proc.Kill() }

// mosquitto is Debian's mosquitto broker: the baseline. It keeps nothing on
// disk (persistence false) and acknowledges QoS 1 publishes at once.
type mosquitto struct {
	addr    string
	logPath string
	proc    *proc.Process
}

func startMosquitto(workDir string) (*mosquitto, error) {
	if _, err := os.Stat(mosquittoPath); err != nil {
		return nil, fmt.Errorf("mosquitto missing (%v): apt-get install -y mosquitto", err)
	}
	dir, err := os.MkdirTemp(workDir, "mosquitto-")
	if err != nil {
		return nil, err
	}
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	m := &mosquitto{addr: addr, logPath: filepath.Join(dir, "mosquitto.log")}
	conf := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n"+
		"max_connections -1\nlog_dest file %s\nlog_type error\nlog_type warning\nconnection_messages false\n",
		port, m.logPath)
	if os.Geteuid() == 0 {
		// Started as root, mosquitto switches to the user "mosquitto", which
		// could not write its log here.
		conf += "user root\n"
	}
	confPath := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(mosquittoPath, "-c", confPath)
	cmd.Dir = dir
	if m.proc, err = proc.Start("mosquitto", cmd); err != nil {
		return nil, err
	}
	if err := m.proc.WaitTCP(addr, mosquittoStartTimeout); err != nil {
		m.proc.Kill()
		return nil, fmt.Errorf("%w\n%s", err, tailFile(m.logPath, 2048))
	}
	return m, nil
}

func (m *mosquitto) stop() error { return m.proc.Stop(stopTimeout) }
