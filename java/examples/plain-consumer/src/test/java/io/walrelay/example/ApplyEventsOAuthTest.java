package io.walrelay.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.walrelay.consumer.TokenEndpoint;
import io.walrelay.consumer.conformance.TestPostgres;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * ApplyEvents logging in with OAuth through {@code --kafka} properties, the
 * client secret from an environment variable and the token endpoint allowed
 * by a JVM flag, run as a child JVM the way an end-to-end test runs it
 * ({@code java -D... -cp ... ApplyEvents}). The child's token request goes
 * to a token endpoint on 127.0.0.1 before it talks to any broker (nothing
 * listens at its bootstrap address); its database is a throwaway PostgreSQL
 * cluster.
 */
@Tag("integration")
class ApplyEventsOAuthTest {
    private static final String SECRET = "s3cret-never-shown";
    private static final String ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls";
    private static TestPostgres pg;

    @BeforeAll
    static void startPostgres() throws IOException {
        pg = new TestPostgres();
    }

    @AfterAll
    static void stopPostgres() {
        if (pg != null) {
            pg.close();
        }
    }

    /** {@code java [jvmFlags] -cp ... ApplyEvents} with OAuth {@code --kafka} properties. */
    private static List<String> command(List<String> jvmFlags, String tokenUrl, List<String> login) throws IOException {
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        cmd.addAll(jvmFlags);
        cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), ApplyEvents.class.getName(),
                "--bootstrap", "127.0.0.1:" + port, "--jdbc-url", pg.createDatabase(), "--group", "billing",
                "--topic", "orders"));
        List<String> properties = new ArrayList<>(List.of("security.protocol=SASL_PLAINTEXT",
                "sasl.mechanism=OAUTHBEARER",
                "sasl.login.callback.handler.class="
                        + "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
                "sasl.oauthbearer.token.endpoint.url=" + tokenUrl));
        properties.addAll(login);
        for (String p : properties) {
            cmd.add("--kafka");
            cmd.add(p);
        }
        return cmd;
    }

    /** Runs {@code cmd} until the token endpoint got a request (or it ended), then stops it with SIGTERM. */
    private static String runUntilTokenRequested(List<String> cmd, Map<String, String> env, TokenEndpoint endpoint,
            Path dir) throws Exception {
        Path log = dir.resolve("apply-events.log");
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile());
        pb.environment().putAll(env);
        Process p = pb.start();
        try {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (endpoint.requests().isEmpty() && p.isAlive() && System.nanoTime() < deadline) {
                Thread.sleep(50);
            }
            p.destroy(); // SIGTERM: a clean stop
            assertTrue(p.waitFor(60, TimeUnit.SECONDS), "ApplyEvents did not stop");
        } finally {
            p.destroyForcibly();
        }
        String out = Files.readString(log, StandardCharsets.UTF_8);
        assertEquals(0, p.exitValue(), out);
        return out;
    }

    @Test
    void itLogsInWithOAuthItsClientSecretFromTheEnvironment(@TempDir Path dir) throws Exception {
        try (TokenEndpoint endpoint = new TokenEndpoint("billing")) {
            List<String> cmd = command(List.of("-D" + ALLOWED_URLS + "=" + endpoint.url()), endpoint.url(), List.of(
                    "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;",
                    "sasl.oauthbearer.client.credentials.client.id=billing",
                    "sasl.oauthbearer.client.credentials.client.secret=env:KAFKA_CLIENT_SECRET",
                    "sasl.oauthbearer.scope=kafka"));
            String out = runUntilTokenRequested(cmd, Map.of("KAFKA_CLIENT_SECRET", SECRET), endpoint, dir);
            assertFalse(endpoint.requests().isEmpty(), out);
            assertEquals(TokenEndpoint.basic("billing", SECRET), endpoint.requests().get(0).authorization());
            assertFalse(out.contains(SECRET), out);
        }
    }

    @Test
    void itTakesAWholeJaasConfigFromTheEnvironment(@TempDir Path dir) throws Exception {
        try (TokenEndpoint endpoint = new TokenEndpoint("billing")) {
            List<String> cmd = command(List.of("-D" + ALLOWED_URLS + "=" + endpoint.url()), endpoint.url(),
                    List.of("sasl.jaas.config=env:KAFKA_JAAS_CONFIG"));
            String out = runUntilTokenRequested(cmd, Map.of("KAFKA_JAAS_CONFIG", ApplyEventsTest.jaas()), endpoint, dir);
            assertFalse(endpoint.requests().isEmpty(), out);
            assertEquals(TokenEndpoint.basic("billing", SECRET), endpoint.requests().get(0).authorization());
            assertFalse(out.contains(SECRET), out);
        }
    }

    @Test
    void aMissingSecretVariableIsNamedAndNothingStarts() throws Exception {
        List<String> cmd = command(List.of(), "http://127.0.0.1:9/token",
                List.of("sasl.oauthbearer.client.credentials.client.secret=env:WALRELAY_TEST_UNSET_SECRET"));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(p.waitFor(60, TimeUnit.SECONDS));
        assertEquals(2, p.exitValue(), out);
        assertTrue(out.contains("the Kafka property sasl.oauthbearer.client.credentials.client.secret: "
                + "environment variable WALRELAY_TEST_UNSET_SECRET is not set"), out);
    }
}
