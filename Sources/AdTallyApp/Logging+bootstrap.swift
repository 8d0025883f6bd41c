import Logging

/// Structured logs to stderr at the configured level, once per process.
public enum LogSetup {
    /// Bootstraps swift-log and returns the root logger.
    public static func bootstrap(level: Logger.Level) -> Logger {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        var logger = Logger(label: "adtally")
        logger.logLevel = level
        return logger
    }
}
