package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * Logging in with OAuth (SASL OAUTHBEARER, OIDC client credentials): the
 * loop hands kafka-clients' login settings through unchanged, and the client
 * secret stays out of the log.
 *
 * <p>The KafkaConsumer fetches its token when it is created, before it talks
 * to any broker, so a token endpoint on 127.0.0.1 (below) and a bootstrap
 * address where nothing listens are enough to see what the loop's consumer
 * sends the identity provider; the database is never reached. The login to a
 * real OAuth cluster is an end-to-end test of the relay's suites.
 */
class OAuthLoginTest {
    private static final String SECRET = "s3cret-never-logged";
    private static final String ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls";
    private static final String LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";

    private TokenEndpoint endpoint;
    private String tokenUrl;

    @BeforeEach
    void startTokenEndpoint() throws Exception {
        endpoint = new TokenEndpoint("orders-service");
        tokenUrl = endpoint.url();
    }

    @AfterEach
    void stopTokenEndpoint() {
        endpoint.close();
        System.clearProperty(ALLOWED_URLS);
    }

    /** A consumer configuration for a broker address where nothing listens, logging in with OAUTHBEARER. */
    private static Map<String, Object> oauthBearer(String tokenUrl) throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        Map<String, Object> kafka = new HashMap<>();
        kafka.put("bootstrap.servers", "127.0.0.1:" + port);
        kafka.put("group.id", "orders-service");
        kafka.put("security.protocol", "SASL_PLAINTEXT");
        kafka.put("sasl.mechanism", "OAUTHBEARER");
        kafka.put("sasl.login.callback.handler.class",
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler");
        kafka.put("sasl.oauthbearer.token.endpoint.url", tokenUrl);
        return kafka;
    }

    /** The client credentials in the JAAS configuration, as every kafka-clients version takes them. */
    private static Map<String, Object> jaasClientCredentials(String tokenUrl) throws Exception {
        Map<String, Object> kafka = oauthBearer(tokenUrl);
        kafka.put("sasl.jaas.config", LOGIN_MODULE + " required clientId=\"orders-service\" clientSecret=\""
                + SECRET + "\" scope=\"kafka\";");
        return kafka;
    }

    /** Runs a loop on {@code kafka} until the token endpoint got a request, then stops it. */
    private void runUntilTokenRequested(Map<String, Object> kafka) throws Exception {
        PGSimpleDataSource never = new PGSimpleDataSource();
        never.setUrl("jdbc:postgresql://127.0.0.1:1/never?user=never");
        ConsumerLoop loop = new ConsumerLoop(kafka, List.of("orders"), never, Settings.DEFAULT.withPoolSize(1));
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread t = new Thread(() -> {
            try {
                loop.runBatches((conn, batch) -> { });
            } catch (Throwable e) {
                failed.set(e);
            }
        }, "oauth-loop");
        t.start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (endpoint.requests().isEmpty() && failed.get() == null && System.nanoTime() < deadline) {
            Thread.sleep(20);
        }
        loop.stop();
        t.join(30_000);
        assertFalse(t.isAlive(), "the loop did not stop");
        if (failed.get() != null) {
            throw new AssertionError("the loop failed", failed.get());
        }
        assertFalse(endpoint.requests().isEmpty(), "no token request in 30 s");
    }

    private void assertClientCredentials() {
        TokenEndpoint.Request request = endpoint.requests().get(0);
        assertEquals(TokenEndpoint.basic("orders-service", SECRET), request.authorization());
        assertTrue(request.body().contains("grant_type=client_credentials"), request.body());
        assertTrue(request.body().contains("scope=kafka"), request.body());
    }

    @Test
    void theLoopLogsInWithTheClientCredentialsOfTheJaasConfig() throws Exception {
        System.setProperty(ALLOWED_URLS, tokenUrl);
        runUntilTokenRequested(jaasClientCredentials(tokenUrl));
        assertClientCredentials();
    }

    @Test
    void theLoopLogsInWithTheClientCredentialsProperties() throws Exception {
        // kafka-clients 4.1's properties: only the secret needs hiding, not the whole JAAS line.
        System.setProperty(ALLOWED_URLS, tokenUrl);
        Map<String, Object> kafka = oauthBearer(tokenUrl);
        kafka.put("sasl.jaas.config", LOGIN_MODULE + " required ;");
        kafka.put("sasl.oauthbearer.client.credentials.client.id", "orders-service");
        kafka.put("sasl.oauthbearer.client.credentials.client.secret", "env:KAFKA_CLIENT_SECRET");
        kafka.put("sasl.oauthbearer.scope", "kafka");
        runUntilTokenRequested(KafkaSecrets.resolve(kafka, Map.of("KAFKA_CLIENT_SECRET", SECRET)::get));
        assertClientCredentials();
    }

    @Test
    void theClientSecretIsNotLogged() throws Exception {
        System.setProperty(ALLOWED_URLS, tokenUrl);
        PrintStream stderr = System.err;
        ByteArrayOutputStream captured = new ByteArrayOutputStream();
        // slf4j-simple (the tests' binding, at WARN) writes to whatever System.err is when it logs;
        // kafka-clients' INFO dump of the configuration shows sasl.jaas.config and passwords as [hidden].
        System.setErr(new PrintStream(captured, true, StandardCharsets.UTF_8));
        try {
            runUntilTokenRequested(jaasClientCredentials(tokenUrl));
        } finally {
            System.setErr(stderr);
        }
        String log = captured.toString(StandardCharsets.UTF_8);
        // kafka-clients 4.1 warns that the JAAS options are deprecated, naming them, not their values.
        assertTrue(log.contains("clientSecret"), "nothing captured:\n" + log);
        assertFalse(log.contains(SECRET), log);
    }

    @Test
    void aTokenEndpointTheJvmDoesNotAllowNamesTheSystemProperty() throws Exception {
        System.clearProperty(ALLOWED_URLS);
        PGSimpleDataSource never = new PGSimpleDataSource();
        never.setUrl("jdbc:postgresql://127.0.0.1:1/never?user=never");
        ConsumerLoop loop = new ConsumerLoop(jaasClientCredentials(tokenUrl), List.of("orders"), never, Settings.DEFAULT);
        RuntimeException e = assertThrows(RuntimeException.class, () -> loop.runBatches((conn, batch) -> { }));
        StringBuilder chain = new StringBuilder();
        for (Throwable c = e; c != null; c = c.getCause()) {
            chain.append(c.getMessage()).append('\n');
        }
        assertNotNull(e.getMessage());
        assertTrue(chain.toString().contains(ALLOWED_URLS), chain.toString());
        assertFalse(chain.toString().contains(SECRET), chain.toString());
        assertTrue(endpoint.requests().isEmpty());
    }

    @Test
    void withoutJose4jTheLoopSaysWhichDependencyToAdd() throws Exception {
        Map<String, Object> kafka = jaasClientCredentials(tokenUrl);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> OAuthLogin.check(kafka, className -> false));
        assertTrue(e.getMessage().contains("org.bitbucket.b_c:jose4j"), e.getMessage());
        assertTrue(e.getMessage().contains("com.fasterxml.jackson.core:jackson-databind"), e.getMessage());
        assertFalse(e.getMessage().contains(SECRET), e.getMessage());
        OAuthLogin.check(kafka, className -> true);
        // Other logins do not need it.
        kafka.remove("sasl.login.callback.handler.class");
        OAuthLogin.check(kafka, className -> false);
    }
}
