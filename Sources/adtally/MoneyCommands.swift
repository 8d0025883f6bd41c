import AdTallyApp
import AdTallyCore
import AdTallyStorage
import ArgumentParser
import Foundation

/// `adtally rates set|list|delete|import`: the rate card that prices impressions and
/// taps without reported revenue (DESIGN §3).
struct RatesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rates", abstract: "Set, list, delete and import rate card entries (CPM and CPT per network, format, country).",
        subcommands: [Set.self, List.self, Delete.self, Import.self]
    )

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Add or replace an entry. It prices from --from on, until the same key's next date; reports re-price at once."
        )
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Ad network, e.g. admob.") var network: String
        @Option(help: "banner, interstitial, native or rewarded.") var format: String
        @Option(help: "ISO 3166-1 alpha-2 country, or * for any (default *).") var country = "*"
        @Option(help: "ISO 4217 currency of the amounts.") var currency: String
        @Option(help: "Per thousand impressions, a decimal (2.50).") var cpm = "0"
        @Option(help: "Per tap, a decimal (0.10).") var cpt = "0"
        @Option(name: .customLong("from"), help: "First UTC date it applies to, YYYY-MM-DD.") var effectiveFrom: String

        func run() async throws {
            let entry = try RateCardEntry.parse(
                network: network, format: format, country: country, currency: currency, cpm: cpm, cpt: cpt, effectiveFrom: effectiveFrom
            )
            try await database.withDatabase { database, _ in try await MoneyStore(pool: database.pool).setRates([entry]) }
            print("rate set: \(entry.network) \(entry.format) \(entry.country) from \(entry.effectiveFrom): "
                + "CPM \(Money.plain(micros: entry.cpmMicros, currency: entry.currency)) \(entry.currency), "
                + "CPT \(Money.plain(micros: entry.cptMicros, currency: entry.currency)) \(entry.currency)")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the rate card, with the dates each entry is in force.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Only this network.") var network: String?
        @Option(help: "table or json.") var format = OutputFormat.table

        func run() async throws {
            let entries = try await database.withDatabase { database, _ in try await MoneyStore(pool: database.pool).rates(network: network) }
            if format == .json { return try printJSON(["rates": entries]) }
            // An entry is in force until the next date of the same network, format and country.
            var rows: [[String]] = []
            for (index, entry) in entries.enumerated() {
                let next = entries.dropFirst(index + 1).first {
                    $0.network == entry.network && $0.format == entry.format && $0.country == entry.country
                }
                let until = next.flatMap { ReportQuery.parseDate($0.effectiveFrom) }.map { ReportQuery.formatDate($0 - 1) } ?? "…"
                rows.append([
                    entry.network, entry.format, entry.country, entry.currency,
                    Money.plain(micros: entry.cpmMicros, currency: entry.currency), Money.plain(micros: entry.cptMicros, currency: entry.currency),
                    entry.effectiveFrom, until,
                ])
            }
            printTable(["NETWORK", "FORMAT", "COUNTRY", "CURRENCY", "CPM", "CPT", "FROM", "UNTIL"], rows)
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete an entry; the key's earlier entry (or the any-country one) prices its dates again.")
        @OptionGroup var database: DatabaseOptions
        @Option var network: String
        @Option var format: String
        @Option(help: "Country, or * (default).") var country = "*"
        @Option(name: .customLong("from"), help: "The entry's effective date.") var effectiveFrom: String

        func run() async throws {
            let found = try await database.withDatabase { database, _ in
                try await MoneyStore(pool: database.pool).deleteRate(network: network, format: format, country: country, effectiveFrom: effectiveFrom)
            }
            guard found else { throw ValidationError("no rate card entry \(network) \(format) \(country) from \(effectiveFrom)") }
            print("rate deleted: \(network) \(format) \(country) from \(effectiveFrom)")
        }
    }

    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Import a rate card CSV: network,format,country,currency,cpm,cpt,effective_from (country * for any). All lines or none."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The CSV file.") var file: String

        func run() async throws {
            let entries = try RateCardEntry.parseCSV(try readFile(file))
            let stored = try await database.withDatabase { database, _ in try await MoneyStore(pool: database.pool).setRates(entries) }
            print("\(stored) rate card entries imported from \(file)")
        }
    }
}

/// `adtally fx import|list|set`: daily FX rates that convert every amount into a
/// report's currency at the rate of its UTC date.
struct FXCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fx", abstract: "Import, set and list daily FX rates.", subcommands: [Import.self, Set.self, List.self]
    )

    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Import FX rates: a CSV of date,currency,rate, or the ECB's daily reference CSV (Date,USD,JPY,…)."
        )
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The CSV file.") var file: String
        @Option(help: "The currency the rates are per one unit of (the ECB's: EUR).") var base = "EUR"
        @Flag(help: "Carry each rate over the following days without one (weekends, holidays; up to \(MoneyStore.maxCarriedDays) days), marked as carried.")
        var fillGaps = false

        func run() async throws {
            let bytes = try readFile(file)
            let (result, skipped) = try await database.withDatabase { database, _ in
                try await MoneyStore(pool: database.pool).importFX(csv: bytes, base: base, fillGaps: fillGaps)
            }
            if !skipped.isEmpty {
                print("skipped the columns of currencies no longer in ISO 4217 (no event can carry them): \(skipped.sorted().joined(separator: ", "))")
            }
            let days = [result.firstDay, result.lastDay].compactMap { $0 }
            print("\(result.stored) FX rates per \(base) imported from \(file)"
                + (days.isEmpty ? "" : " (\(days.first!) to \(days.last!))")
                + (fillGaps ? "; \(result.carried) days without a rate filled from the day before" : ""))
        }
    }

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Set one day's rate of a currency.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "UTC date, YYYY-MM-DD.") var date: String
        @Option(help: "ISO 4217 currency.") var currency: String
        @Option(help: "Units of the currency per one unit of the base.") var rate: String
        @Option(help: "The base currency.") var base = "EUR"

        func run() async throws {
            let fx = try FXRate.parse(date: date, base: base, currency: currency, rate: rate)
            _ = try await database.withDatabase { database, _ in try await MoneyStore(pool: database.pool).importFX([fx]) }
            print("FX rate set: \(fx.date) 1 \(fx.base) = \(fx.rate) \(fx.currency)")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List FX rates.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Only this currency.") var currency: String?
        @Option(help: "Only this base.") var base: String?
        @Option(help: "From this date on.") var from: String?
        @Option(help: "Up to this date.") var to: String?
        @Option(help: "table or json.") var format = OutputFormat.table

        func validate() throws {
            for (name, value) in [("--from", from), ("--to", to)] {
                if let value, ReportQuery.parseDate(value) == nil { throw ValidationError("\(name) must be a date, YYYY-MM-DD") }
            }
        }

        func run() async throws {
            let rates = try await database.withDatabase { database, _ in
                try await MoneyStore(pool: database.pool).fxRates(currency: currency, base: base, from: from, to: to)
            }
            if format == .json { return try printJSON(["rates": rates]) }
            printTable(["DATE", "BASE", "CURRENCY", "RATE", "CARRIED FROM"], rates.map { [$0.date, $0.base, $0.currency, $0.rate, $0.carriedFrom ?? ""] })
        }
    }
}

/// A whole file's bytes, or an error that names it; with `atMost`, a larger file is
/// refused by its size before it is read.
func readFile(_ path: String, atMost limit: Int? = nil, what: String = "file") throws -> [UInt8] {
    if let limit, let size = (try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? Int, size > limit {
        throw ValidationError("\(what): \(path) is \(size) bytes; at most \(limit) (split it)")
    }
    guard let data = FileManager.default.contents(atPath: path) else { throw ValidationError("\(what): cannot read \(path)") }
    return [UInt8](data)
}
